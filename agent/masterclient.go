package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kfelastic/kfelastic/agent/masterconn"
	"github.com/kfelastic/kfelastic/agent/nodecheck"
	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/jobtoken"
)

// MasterConfig is how an agent reaches the kfelastic master.
type MasterConfig struct {
	// Endpoint is the master's host:port (--rdzv-endpoint).
	Endpoint string
	// Token is the job's token (--token-file).
	Token string
	// Host is the machine the pod runs on (the Kubernetes node), which the
	// master avoids when it relaunches a pod that failed the node check.
	Host string
	// HeartbeatInterval is how long the master may hold a heartbeat; the
	// agent calls again at once, so this is also the call rate.
	HeartbeatInterval time.Duration
	// Unreachable is how long the master may be unreachable before the
	// agent gives up (a master restart is a pause, not an error).
	Unreachable time.Duration
	// Check runs this node's part of a health-check round; nil: the Go
	// check with no interpreter.
	Check  *nodecheck.Checker
	Logger *slog.Logger
	// Dialer, when set, opens the connections to Endpoint instead of TCP:
	// tests serve a master over an in-memory pipe inside a testing/synctest
	// bubble, where a TCP socket cannot be waited on durably.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
}

// Master is the rendezvous of an elastic job through the kfelastic master
// (docs/DESIGN.md §5), over gRPC: joins are long polls, the health check runs
// inside Next when the master asks for it, and a heartbeat long poll runs
// beside the workers for the agent's life, bringing the master's control
// actions (restart into a new round, exit) without polling. Every call is
// retried with backoff while the master is unreachable, up to Unreachable.
type Master struct {
	cfg         MasterConfig
	conn        *grpc.ClientConn
	client      masterpb.MasterClient
	incarnation string

	mu      sync.Mutex
	node    *masterpb.Node
	after   int64 // the latest round this node got
	round   int64 // the round its workers run in (0: none)
	changed chan struct{}
	exit    *masterpb.Exclusion
	step    int64
	hbStop  context.CancelFunc
	hbDone  chan struct{}
	// hbCall cancels the heartbeat in flight, sent for round hbRound: one
	// held for an older round is cut short when the node gets a new one.
	hbCall  context.CancelFunc
	hbRound int64
	// refused is the master's refusal that ended the heartbeat for good
	// (refusedForGood); Next returns it instead of joining again.
	refused error
}

// ExcludedError is the master telling a node to exit (failed health
// check, straggler, job stopped, rank taken over, join timeout).
type ExcludedError struct {
	Code     string
	Message  string
	Relaunch bool
	// Permanent makes the pod's document NON_RECOVERABLE: the master
	// refused the node's own description (refusedNode).
	Permanent bool
}

func (e *ExcludedError) Error() string {
	return fmt.Sprintf("the master excluded this node: %s: %s", e.Code, e.Message)
}

// AuthError is the master refusing this agent's job token: the token file
// does not hold the token the master was started with (another job's
// Secret, a stale file). No retry or restart fixes it.
type AuthError struct {
	Endpoint string
	Message  string // the master's answer
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("the master at %s refused this pod's job token (%s): --token-file does not hold the token the master was started with",
		e.Endpoint, e.Message)
}

// DialMaster prepares the client; it connects lazily (the master may start
// after the agents).
func DialMaster(cfg MasterConfig) (*Master, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("no master endpoint (--rdzv-endpoint)")
	}
	if err := jobtoken.Check(cfg.Token); err != nil {
		return nil, fmt.Errorf("the master's job token (--token-file): %w", err)
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 5 * time.Second
	}
	if cfg.Unreachable <= 0 {
		cfg.Unreachable = 10 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	conn, err := masterconn.Dial(cfg.Endpoint, cfg.Token, cfg.Dialer)
	if err != nil {
		return nil, fmt.Errorf("master %s: %w", cfg.Endpoint, err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &Master{cfg: cfg, conn: conn, client: masterpb.NewMasterClient(conn), incarnation: hex.EncodeToString(b),
		changed: make(chan struct{})}, nil
}

// Client is the raw protocol client (for the store relay).
func (m *Master) Client() masterpb.MasterClient { return m.client }

// Incarnation names this agent process to the master: in its node, and in
// the store sessions of its store relay.
func (m *Master) Incarnation() string { return m.incarnation }

// Close stops the heartbeat and the connection.
func (m *Master) Close() error {
	m.stopHeartbeat()
	return m.conn.Close()
}

// retry runs call until it succeeds, fails for good, ctx ends, or the
// master was unreachable for cfg.Unreachable.
func (m *Master) retry(ctx context.Context, what string, call func(ctx context.Context) error) error {
	gaveUp, err := masterconn.Retry(ctx, m.cfg.Logger, m.cfg.Unreachable, call, "call", what, "endpoint", m.cfg.Endpoint)
	if gaveUp {
		return fmt.Errorf("master %s unreachable for %s: %w", m.cfg.Endpoint, m.cfg.Unreachable, err)
	}
	return m.authError(err)
}

// authError is err as an *AuthError when it is the master refusing the job
// token, else err: one classification for every call.
func (m *Master) authError(err error) error {
	if c := status.Code(err); c == codes.Unauthenticated || c == codes.PermissionDenied {
		return &AuthError{Endpoint: m.cfg.Endpoint, Message: fmt.Sprintf("%s: %s", c, status.Convert(err).Message())}
	}
	return err
}

// refusedForGood reports whether the master's answer to a heartbeat
// refuses this node for good, so that asking again cannot help. What the
// master answers a heartbeat mid-run, and why:
//   - Unauthenticated (PermissionDenied from a proxy): the master at the
//     endpoint holds another token (restarted with another Secret, or
//     another job's master);
//   - NotFound: the master does not know this node. Once the node runs in
//     a round (inRound) its join was durable before it was answered, so
//     the master lost it: restarted on an empty or another --state. Before
//     that, a Join in progress registers it, and decides;
//   - InvalidArgument: the master refuses the node's own description (its
//     rank outside the --nnodes it restarted with, a newer protocol):
//     NodeRefused (refusedNode);
//   - FailedPrecondition, AlreadyExists, OutOfRange, Unimplemented: no
//     heartbeat gets them from this master; refusals all the same.
//
// Everything else is the master away or busy (Unavailable: stopping,
// restarting, fenced; DeadlineExceeded; ResourceExhausted; Internal,
// Unknown), retried as long as the agent lives.
func refusedForGood(err error, inRound bool) bool {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.FailedPrecondition,
		codes.AlreadyExists, codes.OutOfRange, codes.Unimplemented:
		return true
	case codes.NotFound:
		return inRound
	}
	return false
}

func (m *Master) nodePB(n NodeInfo) *masterpb.Node {
	return &masterpb.Node{Pod: n.ID, Incarnation: m.incarnation, Rank: int32(n.Rank), LocalWorldSize: int32(n.LocalWorldSize),
		Addr: n.Addr, Port: int32(n.Port), Host: m.cfg.Host}
}

// refusedNode is err as the node's end when the master refused the node's
// own description of itself (InvalidArgument: its rank outside --nnodes, a
// name or address too long): NodeRefused, NON_RECOVERABLE, exit 1, since
// the pod would describe itself the same way after any restart; nil for
// any other error. what names the call.
func refusedNode(what string, err error) *ExcludedError {
	if status.Code(err) != codes.InvalidArgument {
		return nil
	}
	return &ExcludedError{Code: kferrors.CodeNodeRefused, Permanent: true,
		Message: fmt.Sprintf("the master refused this node's %s: %s", what, status.Convert(err).Message())}
}

// joinWait is how long one Join call is held by the master.
const joinWait = 30 * time.Second

// Next joins the round after the latest this node got and returns it,
// running health-check rounds on the way when the master asks for them.
func (m *Master) Next(ctx context.Context, node NodeInfo) (Round, error) {
	m.mu.Lock()
	after := m.after
	m.round = 0 // the workers stopped
	m.mu.Unlock()
	pb := m.nodePB(node)
	for {
		// A node the master told to exit (on a heartbeat) does not join
		// again: a Join of this incarnation would take its rank back from
		// the pod that replaced it. One whose heartbeat the master refused
		// for good ends with that refusal, as a refused Join would.
		if e := m.exclusion(); e != nil {
			return Round{}, e
		}
		if err := m.refusal(); err != nil {
			return Round{}, err
		}
		var res *masterpb.JoinResponse
		err := m.retry(ctx, "Join", func(ctx context.Context) error {
			cctx, cancel := context.WithTimeout(ctx, joinWait+10*time.Second)
			defer cancel()
			var err error
			res, err = m.client.Join(cctx, &masterpb.JoinRequest{Node: pb, AfterRound: after, WaitMs: joinWait.Milliseconds()})
			return err
		})
		if err != nil {
			if status.Code(err) == codes.AlreadyExists {
				// The master refuses the rank for good (this pod holds
				// another; live pods hold them all). Nothing timed out:
				// the document says what happened (kferrors.CodeRankHeld),
				// and the pod exits 1, not brought back for it.
				return Round{}, &ExcludedError{Code: kferrors.CodeRankHeld, Message: "join: " + status.Convert(err).Message()}
			}
			if e := refusedNode("join", err); e != nil {
				return Round{}, e
			}
			var unsendable *masterconn.UnsendableError
			if errors.As(err, &unsendable) {
				// The node's own description cannot be sent (a name that
				// is not UTF-8): the pod would describe itself the same way
				// after any restart, as for the master's refusal.
				return Round{}, &ExcludedError{Code: kferrors.CodeNodeRefused, Permanent: true,
					Message: "this node's join: " + unsendable.Error()}
			}
			return Round{}, fmt.Errorf("join: %w", unwrapStatus(err))
		}
		if pb.Rank < 0 {
			pb.Rank = res.GetRank() // keep the rank the master chose
		}
		m.mu.Lock()
		m.node = pb
		m.mu.Unlock()
		m.startHeartbeat()
		switch o := res.GetOutcome().(type) {
		case *masterpb.JoinResponse_Round:
			r := o.Round
			m.mu.Lock()
			m.after, m.round = r.GetNumber(), r.GetNumber()
			m.changed = make(chan struct{})
			if m.hbCall != nil && m.hbRound != m.round {
				// The heartbeat in flight speaks of the round before (or
				// none): the master holds it for the whole interval, having
				// nothing to say of that round, and would not tell this
				// node in that time that its new round is already outdated
				// (a member that failed as it formed; scenario 7's
				// replacement lost 4 s of 4.3 s so). The next is sent at
				// once, for this round.
				m.hbCall()
			}
			m.mu.Unlock()
			return Round{Number: int(r.GetNumber()), RunID: r.GetRunId(), GroupRank: int(r.GetGroupRank()),
				GroupWorldSize: int(r.GetGroupWorldSize()), WorldSize: int(r.GetWorldSize()),
				FirstGlobalRank: int(r.GetFirstGlobalRank()), MasterAddr: r.GetMasterAddr(), MasterPort: int(r.GetMasterPort()),
				Departed: int(r.GetDeparted()), DepartedKnown: r.GetDepartedKnown(), DepartedSince: masterpb.Time(r.GetDepartedSinceUnixNano())}, nil
		case *masterpb.JoinResponse_Check:
			if err := m.runCheck(ctx, pb, o.Check); err != nil {
				return Round{}, err
			}
		case *masterpb.JoinResponse_Excluded:
			e := o.Excluded
			return Round{}, &ExcludedError{Code: e.GetCode(), Message: e.GetMessage(), Relaunch: e.GetRelaunch()}
		case *masterpb.JoinResponse_Pending:
			// asked again at once: the master holds the call while nothing changes
		default:
			return Round{}, errors.New("join: the master answered nothing this agent knows")
		}
	}
}

func unwrapStatus(err error) error {
	if s, ok := status.FromError(err); ok && s.Code() != codes.OK {
		return fmt.Errorf("%s: %s", s.Code(), s.Message())
	}
	return err
}

// exclusion is the EXIT a heartbeat brought, as an error; nil if none.
func (m *Master) exclusion() *ExcludedError {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.exit; e != nil {
		return &ExcludedError{Code: e.GetCode(), Message: e.GetMessage(), Relaunch: e.GetRelaunch()}
	}
	return nil
}

// refusal is the heartbeat's refusal for good, nil if none.
func (m *Master) refusal() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refused
}

// runCheck runs one health-check round and reports its result.
func (m *Master) runCheck(ctx context.Context, pb *masterpb.Node, t *masterpb.CheckTask) error {
	task := nodecheck.Task{Check: t.GetCheck(), Round: int(t.GetRound()), Group: int(t.GetGroup()), GroupRank: int(t.GetGroupRank()),
		GroupSize: int(t.GetGroupSize()), LeaderAddr: t.GetLeaderAddr(), LeaderPort: int(t.GetLeaderPort()),
		Timeout: time.Duration(t.GetTimeoutMs()) * time.Millisecond}
	// The master's deadline covers the whole round; the process gets a
	// little less so that its report arrives in time.
	if task.Timeout > 10*time.Second {
		task.Timeout -= 5 * time.Second
	}
	check := m.cfg.Check
	if check == nil {
		check = &nodecheck.Checker{Logger: m.cfg.Logger}
	}
	m.cfg.Logger.Info("node check round", "check", task.Check, "round", task.Round, "group", task.Group,
		"group_rank", task.GroupRank, "group_size", task.GroupSize, "leader", fmt.Sprintf("%s:%d", task.LeaderAddr, task.LeaderPort))
	res := check.Run(ctx, task)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	m.cfg.Logger.Info("node check result", "check", task.Check, "round", task.Round, "ok", res.OK, "elapsed", res.Elapsed, "ready", res.Ready,
		"how", res.How, "message", res.Message)
	err := m.retry(ctx, "ReportCheck", func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := m.client.ReportCheck(cctx, &masterpb.ReportCheckRequest{Node: pb, Check: task.Check, Round: int32(task.Round),
			Ok: res.OK, SelfFailed: res.Self, ElapsedNs: int64(res.Elapsed), ReadyNs: int64(res.Ready), Message: res.Message})
		return err
	})
	if err != nil {
		return fmt.Errorf("report check: %w", unwrapStatus(err))
	}
	return nil
}

// Changed returns when the master says round number is outdated (a node
// waits to join, a member left) or that this node must exit; the agent then
// stops its workers and calls Next, which brings the new round or the
// exclusion.
func (m *Master) Changed(ctx context.Context, number int) error {
	m.mu.Lock()
	if int64(number) != m.round {
		m.mu.Unlock()
		return nil
	}
	ch := m.changed
	m.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SetStep tells the master, on the next heartbeat, the last training step
// the workers printed.
func (m *Master) SetStep(step int64) {
	m.mu.Lock()
	m.step = step
	m.mu.Unlock()
}

func (m *Master) startHeartbeat() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hbStop != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.hbStop = cancel
	m.hbDone = make(chan struct{})
	go m.heartbeat(ctx)
}

func (m *Master) stopHeartbeat() {
	m.mu.Lock()
	stop, done := m.hbStop, m.hbDone
	m.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// heartbeatBackoff caps the pause between failed heartbeats. Short: a call
// to a master that is away fails at once on the client (the channel redials
// on its own backoff), and the sooner a heartbeat passes after a master
// restart, the sooner the agent hears of a round or an exit.
const heartbeatBackoff = 500 * time.Millisecond

// heartbeat is the long poll beside the workers: the master holds it for
// HeartbeatInterval unless it has something to say.
func (m *Master) heartbeat(ctx context.Context) {
	defer close(m.hbDone)
	backoff := 100 * time.Millisecond
	// failing is when heartbeats began to fail (a master restart, the
	// network); the first to pass again says how long it lasted, up to
	// when it was sent (the master may hold it for the interval).
	var failing time.Time
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, m.cfg.HeartbeatInterval+10*time.Second)
		m.mu.Lock()
		node, round, step := m.node, m.round, m.step
		m.hbCall, m.hbRound = cancel, round
		m.mu.Unlock()
		sent := time.Now()
		res, err := m.client.Heartbeat(cctx, &masterpb.HeartbeatRequest{Node: node, Round: round, Step: step,
			WaitMs: m.cfg.HeartbeatInterval.Milliseconds()})
		cancelled := errors.Is(cctx.Err(), context.Canceled)
		m.mu.Lock()
		m.hbCall = nil
		m.mu.Unlock()
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if cancelled {
				continue // cut short for a new round (Next): sent again at once
			}
			if refusedForGood(err, round != 0) {
				m.refuse(err, round)
				return
			}
			if failing.IsZero() {
				failing = time.Now()
			}
			if status.Code(err) == codes.NotFound {
				// Not joined yet in this master's view (it restarted before
				// the join was durable): the join in progress fixes that.
				m.cfg.Logger.Debug("heartbeat before the join is known", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, heartbeatBackoff)
			continue
		}
		backoff = 100 * time.Millisecond
		if !failing.IsZero() {
			m.cfg.Logger.Info("master reachable again", "endpoint", m.cfg.Endpoint, "unreachable_for", sent.Sub(failing).Round(time.Millisecond))
			failing = time.Time{}
		}
		switch res.GetAction() {
		case masterpb.HeartbeatResponse_RESTART, masterpb.HeartbeatResponse_EXIT:
			m.mu.Lock()
			if res.GetAction() == masterpb.HeartbeatResponse_EXIT {
				m.exit = res.GetExit()
			}
			if m.round == round && round != 0 {
				select {
				case <-m.changed:
				default:
					m.cfg.Logger.Info("the master outdates this node's round", "round", round,
						"action", strings.ToLower(res.GetAction().String()), "latest_round", res.GetLatestRound())
					close(m.changed)
				}
			}
			m.mu.Unlock()
			// Do not spin on an answer that stays: the master answers
			// RESTART for round at once until the workers have stopped and
			// Next has cleared the round (a whole stop grace; hundreds of
			// calls a second before this pause), EXIT for good.
			if !m.pause(ctx, round) {
				return
			}
		}
	}
}

// refuse ends the heartbeat on the master's refusal for good: its workers
// stop as for the master's EXIT (Changed returns), and Next returns the
// refusal, which ends the pod with its document (a refused token:
// AuthenticationFailed, exit 1), instead of heartbeats retried while the
// workers run on unsupervised.
func (m *Master) refuse(err error, round int64) {
	err = m.authError(err)
	var auth *AuthError
	if e := refusedNode("heartbeat", err); e != nil {
		err = e
	} else if !errors.As(err, &auth) {
		err = fmt.Errorf("the master refused this node's heartbeat: %w", unwrapStatus(err))
	}
	m.cfg.Logger.Error("the master refuses this node for good; stopping", "endpoint", m.cfg.Endpoint, "round", round, "err", err)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refused = err
	if m.round != 0 {
		select {
		case <-m.changed:
		default:
			close(m.changed)
		}
	}
}

// StoreRefused is the store relay's judge (storerelay.Relay.OnRefused): a
// store call that the master answered by refusing the job token ends the
// node as a refused heartbeat does (refuse), and reports true. Under
// --launcher command torch's store calls go through the relay several
// times a second, so they often meet the refusal first.
func (m *Master) StoreRefused(err error) bool {
	var auth *AuthError
	if !errors.As(m.authError(err), &auth) {
		return false
	}
	m.mu.Lock()
	round := m.round
	m.mu.Unlock()
	m.refuse(err, round)
	return true
}

// pause waits a quarter of the heartbeat interval after an answer that
// stays, cut short when Next brings a round other than round (as it cuts a
// held heartbeat short: hbCall); false when ctx ended.
func (m *Master) pause(ctx context.Context, round int64) bool {
	pctx, cancel := context.WithTimeout(ctx, m.cfg.HeartbeatInterval/4)
	defer cancel()
	m.mu.Lock()
	if m.round != round && m.round != 0 {
		m.mu.Unlock()
		return ctx.Err() == nil // a new round already: its heartbeat at once
	}
	m.hbCall, m.hbRound = cancel, round
	m.mu.Unlock()
	<-pctx.Done()
	m.mu.Lock()
	m.hbCall = nil
	m.mu.Unlock()
	return ctx.Err() == nil
}

// Leave tells the master how this node ended and returns whether the master
// wants the pod back (relaunch) — known is false when the master could not
// be asked.
func (m *Master) Leave(ctx context.Context, succeeded bool, f kferrors.Failure) (relaunch, known bool) {
	m.mu.Lock()
	node := m.node
	m.mu.Unlock()
	m.stopHeartbeat()
	if node == nil {
		return false, false // never joined
	}
	req := &masterpb.LeaveRequest{Node: node, Succeeded: succeeded}
	if !succeeded {
		req.Failure = &masterpb.Failure{Code: f.Code, Message: kferrors.CapMessage(f.Message, 16<<10), Recoverable: f.Recoverable,
			Worker: f.Worker, TimeUnixNano: masterpb.UnixNano(f.Time)}
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var res *masterpb.LeaveResponse
	err := m.retry(ctx, "Leave", func(ctx context.Context) error {
		var err error
		res, err = m.client.Leave(ctx, req)
		return err
	})
	if err != nil {
		m.cfg.Logger.Warn("cannot tell the master how this node ended", "err", unwrapStatus(err))
		return false, false
	}
	if d := res.GetDecision(); d != nil {
		m.cfg.Logger.Info("master decision", "seq", d.GetSeq(), "kind", strings.ToLower(d.GetKind().String()),
			"rank", d.GetRank(), "reason", d.GetReason(), "counted", d.GetCounted(), "message", d.GetMessage())
	}
	return res.GetRelaunch(), true
}
