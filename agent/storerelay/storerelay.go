// Package storerelay serves torch's TCPStore protocol on loopback and
// relays every operation to the kfelastic master's store (docs/DESIGN.md
// §4.8, §5.7):
//
//	r, err := storerelay.Start(ctx, client, incarnation, log) // listens on 127.0.0.1:0
//	child.Env = append(child.Env, "PET_RDZV_ENDPOINT="+r.Addr())
//	...
//	r.Close() // closes the listener, the connections and their master sessions
//
// Under --launcher command torch elastic runs its own c10d rendezvous against
// a TCPStore at the endpoint it is given. The agent gives it this loopback
// port, speaks TCPStore's wire protocol there (agent/tcpstore) and relays
// every operation to the master's store over the authenticated gRPC channel
// (agent/masterconn). torch never reconnects a store connection, so its
// connections end here, on its own agent, and live as long as the agent; the
// relay retries upstream, which makes a master restart a pause for torch,
// not an error.
package storerelay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kfelastic/kfelastic/agent/masterconn"
	"github.com/kfelastic/kfelastic/agent/tcpstore"
	"github.com/kfelastic/kfelastic/api/masterpb"
)

// Relay serves torch's TCPStore protocol on loopback and relays it to the
// master's store.
type Relay struct {
	ln     net.Listener
	client masterpb.MasterClient
	log    *slog.Logger
	prefix string // client ids: prefix + connection number

	ctx    context.Context // ends with Close (or the caller's ctx)
	cancel context.CancelFunc
	nconn  atomic.Uint64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// rdzvKeys are the keys torch compare_set under /torch.rendezvous.:
	// c10d's state (ForgetLost).
	rdzvKeys map[string]bool
	forgets  int
	closed   bool
	wg       sync.WaitGroup
	once     sync.Once
	// refused is OnRefused's f; nil: every error ends its connection.
	refused func(error) bool
}

// relayLongPoll is how long one WAIT is held by the master before the relay
// asks again; well under the master's own cap, so that a master that went
// away while holding it is noticed.
const relayLongPoll = 60 * time.Second

// Start listens on 127.0.0.1:0 — loopback only: no port speaks TCPStore to
// the network — and relays to client until ctx ends or Close. incarnation
// names the agent process (the master's client's, agent.Master.Incarnation)
// in the master's store sessions. Clients without torch 2.2's handshake are
// read with 1.13/2.0 numbering, switching to 2.1's when a connection shows
// it (agent/tcpstore).
func Start(ctx context.Context, client masterpb.MasterClient, incarnation string, log *slog.Logger) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("store relay: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &Relay{ln: ln, client: client, log: log.With("relay", ln.Addr().String()),
		// The incarnation is unique per agent process and the random part
		// per relay, so no two connections ever share a session, even
		// across restarts of the agent's container.
		prefix: fmt.Sprintf("relay/%s/%08x/", incarnation, mathrand.Uint32()),
		ctx:    rctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	context.AfterFunc(rctx, func() { _ = r.Close() })
	return r, nil
}

// OnRefused has f judge each error that the master answers a call with,
// transient ones retried first. Where f returns true (the agent: the master
// refused the job token, so the node ends for good), the call that met it
// is held unanswered until its connection or the relay closes: torch would
// otherwise fail first, and its own error (a broken store connection)
// would hide the refusal as the pod's root cause. Set it before torch
// connects.
func (r *Relay) OnRefused(f func(err error) bool) {
	r.mu.Lock()
	r.refused = f
	r.mu.Unlock()
}

// Addr is where torch connects: "127.0.0.1:PORT".
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Close stops accepting, closes every connection and their master sessions,
// and returns when the relay's goroutines have ended. It is idempotent.
func (r *Relay) Close() error {
	r.once.Do(func() {
		r.cancel()
		_ = r.ln.Close()
		r.mu.Lock()
		r.closed = true
		for c := range r.conns {
			_ = c.Close()
		}
		r.mu.Unlock()
	})
	r.wg.Wait()
	return nil
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			return
		}
		r.conns[c] = struct{}{}
		r.wg.Add(1)
		r.mu.Unlock()
		go r.serve(c, r.prefix+fmt.Sprint(r.nconn.Add(1)))
	}
}

// relayConn is one torch connection and its master session.
type relayConn struct {
	r      *Relay
	conn   net.Conn
	client string
	seq    uint64 // the last mutation's sequence number
	log    *slog.Logger

	ctx    context.Context // ends when the connection does
	cancel context.CancelFunc

	wmu sync.Mutex // replies are written whole, by the reader and by WAITs
	w   *bufio.Writer

	waits   sync.WaitGroup
	waitMu  sync.Mutex
	waiting map[*pendingWait]struct{}
	dec     *tcpstore.Decoder
}

// pendingWait is a WAIT being relayed; CANCEL_WAIT ends it.
type pendingWait struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *Relay) serve(conn net.Conn, client string) {
	ctx, cancel := context.WithCancel(r.ctx)
	c := &relayConn{r: r, conn: conn, client: client, ctx: ctx, cancel: cancel,
		w: bufio.NewWriter(conn), waiting: map[*pendingWait]struct{}{},
		dec: tcpstore.NewDecoder(conn, tcpstore.Torch113, tcpstore.Limits{}),
		log: r.log.With("client", client)}
	defer func() {
		cancel()
		_ = conn.Close()
		c.waits.Wait()
		r.mu.Lock()
		delete(r.conns, conn)
		r.mu.Unlock()
		c.closeSession()
		r.wg.Done()
	}()
	for {
		req, err := c.dec.Next()
		if err != nil {
			if errors.Is(err, tcpstore.ErrTooLarge) || errors.Is(err, tcpstore.ErrUnknown) || errors.Is(err, io.ErrUnexpectedEOF) {
				c.log.Warn("store relay: closing a torch connection that sent a bad frame", "err", err)
			} else {
				c.log.Debug("store relay: torch connection ended", "err", err)
			}
			return
		}
		if err := c.handle(req); err != nil {
			if ctx.Err() == nil {
				c.log.Warn("store relay: closing a torch connection", "cmd", req.Cmd.String(),
					"numbering", c.dec.Numbering().String(), "err", err)
			}
			return
		}
	}
}

// closeSession tells the master to forget this connection's session; best
// effort, with a short deadline of its own (the relay may be closing).
func (c *relayConn) closeSession() {
	if c.seq == 0 {
		return // no mutation: the master never recorded a session
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.r.client.CloseStoreSession(ctx, &masterpb.CloseStoreSessionRequest{Client: c.client}); err != nil {
		c.log.Debug("store relay: session not closed", "err", err)
	}
}

// errGone is a request the relay answers by closing the connection, as
// torch's own server does (a GET of a missing key before 2.2, an ADD to a
// value that is not a number, a command the master has no equivalent for).
var errGone = errors.New("store relay: torch's server closes the connection here")

func (c *relayConn) handle(req tcpstore.Request) error {
	if c.dec.Numbering() == tcpstore.Torch113 {
		// A 1.13 or 2.0 client sends one command at a time and has no
		// CANCEL_WAIT: a command after a WAIT means that the WAIT timed
		// out in the client. Its upstream long poll ends here, and it is
		// never answered: torch's own server would keep the wait forever
		// and answer it late, a byte the client then takes as the start
		// of its next reply.
		c.cancelWaits()
	}
	var out []byte
	switch req.Cmd {
	case tcpstore.Validate:
		return nil // the magic was checked by the decoder; no reply
	case tcpstore.Ping:
		out = tcpstore.AppendU32(nil, req.Number)
	case tcpstore.Set:
		_, err := c.mutate(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: req.Key, Value: req.Value}}})
		return err
	case tcpstore.Append:
		_, err := c.mutate(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_Append{Append: &masterpb.StoreAppend{Key: req.Key, Value: req.Value}}})
		return err
	case tcpstore.MultiSet:
		_, err := c.mutate(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_MultiSet{MultiSet: &masterpb.StoreMultiSet{Keys: req.Keys, Values: req.Values}}})
		return err
	case tcpstore.CompareSet:
		if strings.HasPrefix(req.Key, "/torch.rendezvous.") {
			c.r.mu.Lock()
			if c.r.rdzvKeys == nil {
				c.r.rdzvKeys = map[string]bool{}
			}
			c.r.rdzvKeys[req.Key] = true
			c.r.mu.Unlock()
		}
		res, err := c.mutate(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_CompareSet{CompareSet: &masterpb.StoreCompareSet{
			Key: req.Key, Expected: req.Expected, Desired: req.Value}}})
		if err != nil {
			return err
		}
		out = tcpstore.AppendBytes(nil, res.GetValue())
	case tcpstore.Add:
		res, err := c.mutate(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_Add{Add: &masterpb.StoreAdd{Key: req.Key, Delta: req.Delta}}})
		if err != nil {
			return err
		}
		out = tcpstore.AppendInt(nil, res.GetNumber())
	case tcpstore.Delete:
		res, err := c.mutate(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_Delete{Delete: &masterpb.StoreDelete{Key: req.Key}}})
		if err != nil {
			return err
		}
		out = tcpstore.AppendInt(nil, boolInt(res.GetOk()))
	case tcpstore.Get:
		res, err := c.read(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: req.Key}}})
		if status.Code(err) == codes.NotFound && c.dec.Numbering() == tcpstore.Torch22 {
			// 2.4+'s default (libuv) server answers an empty value; the
			// older one closes the connection, as below.
			res, err = &masterpb.StoreResponse{}, nil
		}
		if err != nil {
			return err
		}
		out = tcpstore.AppendBytes(nil, res.GetValue())
	case tcpstore.MultiGet:
		res, err := c.read(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_MultiGet{MultiGet: &masterpb.StoreMultiGet{Keys: req.Keys}}})
		if err != nil {
			return err
		}
		for _, v := range res.GetValues() {
			out = tcpstore.AppendBytes(out, v)
		}
	case tcpstore.Check:
		res, err := c.read(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_Check{Check: &masterpb.StoreCheck{Keys: req.Keys}}})
		if err != nil {
			return err
		}
		out = []byte{tcpstore.CheckNotReady}
		if res.GetOk() {
			out[0] = tcpstore.CheckReady
		}
	case tcpstore.NumKeys:
		res, err := c.read(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_NumKeys{NumKeys: &masterpb.StoreNumKeys{}}})
		if err != nil {
			return err
		}
		out = tcpstore.AppendInt(nil, res.GetNumber())
	case tcpstore.Wait:
		c.startWait(req.Keys)
		return nil
	case tcpstore.CancelWait:
		c.cancelWaits()
		out = []byte{tcpstore.WaitCanceled}
	default:
		// WATCH_KEY (1.13/2.0 callbacks), QUEUE_* and LIST_KEYS have no
		// counterpart in the master's store; torch elastic uses none.
		return fmt.Errorf("%w: %s is not relayed", errGone, req.Cmd)
	}
	return c.reply(out)
}

// agedHeartbeat is what ForgetLost writes over a lost node's heartbeat:
// long past any keep-alive.
var agedHeartbeat = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// c10dKeepAliveGrace is c10d's default keep-alive interval (5 s) and a
// margin: by then every node alive at the cutoff has written a heartbeat
// after it, even one that is not re-rendezvousing.
const c10dKeepAliveGrace = 6 * time.Second

// Cutoffs are the moments ForgetLost tells the lost nodes' heartbeats by:
// Learnt, when the agent learnt that the master outdated the round, and
// Departed, the earliest failure time the departed pods reported (zero when
// unknown). Survivors that re-rendezvous before the agent learnt beat
// before Learnt, but after Departed: a dead node's last heartbeat is before
// its failure.
type Cutoffs struct{ Learnt, Departed time.Time }

// ForgetLost watches the c10d states torch's agent keeps through this relay
// until the heartbeats still before a cutoff can only be the lost nodes',
// then ages them (c10dstate.go says why), and returns how many; 0 when
// there were none, or ctx ended first. They can once no more than lost
// remain before Departed, or before Learnt (lost: the nodes of the
// outdated round that are not in the new one, as the master counted them;
// 0 when none were, or it did not say), once live nodes have written a
// heartbeat at or after Learnt, or once c10dKeepAliveGrace has passed since
// it.
func (r *Relay) ForgetLost(ctx context.Context, at Cutoffs, live, lost int) int {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		keys := make([]string, 0, len(r.rdzvKeys))
		for k := range r.rdzvKeys {
			keys = append(keys, k)
		}
		r.mu.Unlock()
		for _, key := range keys {
			res, err := r.client.Store(ctx, &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: key}}})
			if err != nil {
				continue
			}
			cutoff, ok := lostCutoff(res.GetValue(), at, live, lost)
			if !ok {
				continue
			}
			if cutoff.IsZero() {
				return 0 // every node beat since: none was lost
			}
			out, n, ok := agedC10dState(res.GetValue(), cutoff, agedHeartbeat)
			if !ok {
				continue
			}
			r.mu.Lock()
			r.forgets++
			client := fmt.Sprintf("%sforget/%d", r.prefix, r.forgets)
			r.mu.Unlock()
			cres, err := r.client.Store(ctx, &masterpb.StoreRequest{Client: client, Seq: 1, Op: &masterpb.StoreRequest_CompareSet{
				CompareSet: &masterpb.StoreCompareSet{Key: key, Expected: res.GetValue(), Desired: out}}})
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, _ = r.client.CloseStoreSession(cctx, &masterpb.CloseStoreSessionRequest{Client: client})
			cancel()
			if err == nil && string(cres.GetValue()) == string(out) {
				return n
			}
			// Someone wrote first: read again at the next tick.
		}
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
		}
	}
}

// lostCutoff is the cutoff to age a c10d state's heartbeats before, now:
// Departed once no more than lost heartbeats (and at least one) are before
// it, else Learnt as lostOnly allows; ok false: not yet (or not a state).
// A zero cutoff with ok: no heartbeat before Learnt, nothing to age.
func lostCutoff(value []byte, at Cutoffs, live, lost int) (cutoff time.Time, ok bool) {
	if !at.Departed.IsZero() && lost > 0 && at.Departed.Before(at.Learnt) {
		// The dying pod's own torch agent may beat once more after its
		// failure, while it stops: then Learnt's rule still applies.
		if before, _, ok := c10dHeartbeats(value, at.Departed); ok && before > 0 && before <= lost {
			return at.Departed, true
		}
	}
	before, after, ok := c10dHeartbeats(value, at.Learnt)
	if !ok {
		return time.Time{}, false
	}
	if before == 0 {
		return time.Time{}, true
	}
	if !lostOnly(before, after, live, lost) && time.Since(at.Learnt) < c10dKeepAliveGrace {
		return time.Time{}, false
	}
	return at.Learnt, true
}

// lostOnly reports whether a c10d state's heartbeats before the cutoff
// (before > 0) can only be lost nodes' now: every node alive at the cutoff
// beats again within torch's keep-alive interval, at once when it
// re-rendezvouses, and a lost one never does. So once no more than the
// master's count of lost nodes remain before the cutoff, those are they: the
// survivors need not wait for a replacement, which joins later, to be
// counted among the live (that wait cost the time a new pod takes to start
// torch). Without the count (0), once live nodes beat after it.
func lostOnly(before, after, live, lost int) bool {
	if lost > 0 && before <= lost {
		return true
	}
	return after >= live
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func (c *relayConn) reply(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.w.Write(b); err != nil {
		return err
	}
	return c.w.Flush()
}

// mutate relays a mutation under the connection's next sequence number; a
// retry after a lost reply or a master restart carries the same number, so
// the master applies it once.
func (c *relayConn) mutate(req *masterpb.StoreRequest) (*masterpb.StoreResponse, error) {
	c.seq++
	req.Client, req.Seq = c.client, c.seq
	return c.read(req)
}

// read relays one call, retrying while the master is away until the
// connection ends. An error the master meant (a missing key, a value that is
// not a number, a limit) ends the connection, as torch's server would.
func (c *relayConn) read(req *masterpb.StoreRequest) (*masterpb.StoreResponse, error) {
	var res *masterpb.StoreResponse
	err := c.retry(c.ctx, func(ctx context.Context) (err error) {
		res, err = c.r.client.Store(ctx, req)
		return err
	})
	return res, err
}

// retry calls until it succeeds, fails for good, or ctx ends; unlike the
// agent's calls to the master it has no give-up time of its own: torch's own timeouts bound
// how long the client waits, and the agent's heartbeat decides when the
// master is gone for good.
func (c *relayConn) retry(ctx context.Context, call func(ctx context.Context) error) error {
	_, err := masterconn.Retry(ctx, c.log, 0, call, "call", "store")
	if err != nil && ctx.Err() == nil {
		c.r.mu.Lock()
		refused := c.r.refused
		c.r.mu.Unlock()
		if refused != nil && refused(err) {
			<-ctx.Done()
			return ctx.Err()
		}
	}
	return err
}

// startWait relays a WAIT as long polls on the master, renewed until every
// key exists, CANCEL_WAIT, or the connection ends; the reader goes on
// meanwhile, as torch's server serves a waiting client's other commands.
func (c *relayConn) startWait(keys []string) {
	ctx, cancel := context.WithCancel(c.ctx)
	p := &pendingWait{cancel: cancel, done: make(chan struct{})}
	c.waitMu.Lock()
	c.waiting[p] = struct{}{}
	c.waitMu.Unlock()
	c.waits.Add(1)
	go func() {
		defer func() {
			cancel()
			c.waitMu.Lock()
			delete(c.waiting, p)
			c.waitMu.Unlock()
			close(p.done)
			c.waits.Done()
		}()
		req := &masterpb.StoreRequest{Client: c.client, Op: &masterpb.StoreRequest_Wait{Wait: &masterpb.StoreWait{
			Keys: keys, TimeoutMs: relayLongPoll.Milliseconds()}}}
		err := c.retry(ctx, func(ctx context.Context) error {
			for {
				_, err := c.r.client.Store(ctx, req)
				if status.Code(err) != codes.DeadlineExceeded || ctx.Err() != nil {
					return err
				}
				// The master's long poll ended with keys still missing: ask again.
			}
		})
		if ctx.Err() != nil {
			return // canceled, or the connection ended
		}
		if err == nil {
			err = c.reply([]byte{tcpstore.StopWaiting})
		}
		if err != nil {
			c.log.Warn("store relay: closing a torch connection", "cmd", "WAIT", "err", err)
			c.cancel()
			_ = c.conn.Close()
		}
	}()
}

// cancelWaits ends the connection's WAITs and returns once each has either
// replied or given up, so that CANCEL_WAIT's reply comes after any WAIT
// reply already on its way, as with torch's server.
func (c *relayConn) cancelWaits() {
	c.waitMu.Lock()
	ps := make([]*pendingWait, 0, len(c.waiting))
	for p := range c.waiting {
		ps = append(ps, p)
	}
	c.waitMu.Unlock()
	for _, p := range ps {
		p.cancel()
		<-p.done
	}
}
