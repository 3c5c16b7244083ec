package master

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master/store"
)

// MaxMessageBytes bounds one gRPC message either way: a torch store value
// at the store's limit plus framing.
const MaxMessageBytes = 80 << 20

// maxWait bounds how long one call may be held (long polls).
const maxWait = 5 * time.Minute

// maxHeaderListBytes bounds the headers of one call, the only thing the
// master reads before it knows the caller has the job's token. An agent's
// headers (method, authority, content type, timeout, user agent, the token)
// take a few hundred bytes; grpc-go's default is 16 MiB.
const maxHeaderListBytes = 16 << 10

// GRPCServer returns grpc-go's server for s (--transport grpc; the lean
// transport, package h2, is the default), which refuses every call without
// the job's token. The token is checked on the call's headers,
// before its message is read (InTapHandle): a refused call costs the
// master its headers and nothing of its body, which the transport drops as
// it arrives, however large. The interceptor checks again, in case a call
// ever reaches a handler some other way.
func (s *Server) GRPCServer() *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.InTapHandle(s.tapAuthorize),
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		grpc.MaxConcurrentStreams(MaxConcurrentCalls),
		grpc.UnaryInterceptor(s.authorize),
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		// Agents hold one connection each, mostly idle or in a long poll,
		// so no buffer stays with a connection: reads take a 1 KiB buffer
		// from a pool only once data is there (grpc-go's ready reader; a
		// call's headers and message usually fit, and larger reads bypass
		// it), writes a 4 KiB one until the flush. Without a read buffer
		// every frame took two read(2)s; with one, a get costs the master
		// ≈10% less CPU. Larger buffers cost peaks at 10,000 agents (16 KiB:
		// up to 465 MiB, as thousands of reads hold one at once). Handlers
		// run on GOMAXPROCS workers instead of a new goroutine per call,
		// which grew each new goroutine's stack (another ≈10% of a get's
		// CPU). Where the rest of the memory goes: docs/DESIGN.md §5.11.
		grpc.ReadBufferSize(1 << 10),
		grpc.WriteBufferSize(4 << 10),
		grpc.SharedWriteBuffer(true),
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	codec := newUndecodableCodec()
	g := grpc.NewServer(append(opts, grpc.ForceServerCodecV2(codec))...)
	g.RegisterService(codec.service(masterpb.Master_ServiceDesc), &service{s: s})
	return g
}

// Serve runs the loop and serves gRPC on lis, with Options.Transport,
// until ctx ends.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	errc := make(chan error, 2)
	go func() { errc <- s.Run(ctx) }()
	var stop func()
	switch s.opts.Transport {
	case TransportLean:
		t, err := s.leanServer()
		if err != nil {
			return err
		}
		go func() { errc <- t.Serve(ctx, lis) }()
		stop = func() {
			lis.Close() // Stop closes it too, once Serve has it
			t.Stop(2 * time.Second)
		}
	default:
		stop = serveGRPC(ctx, s.GRPCServer(), lis, errc)
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	stop()
	<-s.done
	if err == nil || errors.Is(err, grpc.ErrServerStopped) {
		return s.err
	}
	return err
}

// TokenHeader is the metadata key of the job token ("Bearer <token>").
const TokenHeader = "authorization"

// errUnauthenticated is the answer to a call without the job's token:
// nothing about the job in it.
var errUnauthenticated = status.Error(codes.Unauthenticated, "missing or wrong job token")

// authentic reports whether a call's token headers (their values) carry
// the job's token.
func (s *Server) authentic(values []string) bool {
	ok := false
	for _, v := range values {
		if tok, found := strings.CutPrefix(v, "Bearer "); found &&
			subtle.ConstantTimeCompare([]byte(tok), []byte(s.opts.Token)) == 1 {
			ok = true
		}
	}
	return ok
}

// tapAuthorize refuses a call without the token as its stream opens, on
// the transport's goroutine, before any of its message is read.
func (s *Server) tapAuthorize(ctx context.Context, info *tap.Info) (context.Context, error) {
	if !s.authentic(info.Header.Get(TokenHeader)) {
		s.metrics.refused.Inc()
		return ctx, errUnauthenticated
	}
	return ctx, nil
}

func (s *Server) authorize(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	// ValueFromIncomingContext, not FromIncomingContext: no copy of every
	// header per call.
	if !s.authentic(metadata.ValueFromIncomingContext(ctx, TokenHeader)) {
		s.metrics.refused.Inc()
		return nil, errUnauthenticated
	}
	return handler(ctx, req)
}

// grpcError classifies an error into a status code, once, at the boundary.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, errStopped), errors.Is(err, ErrFenced):
		code = codes.Unavailable
	case errors.Is(err, ErrInvalid), errors.Is(err, store.ErrInvalid), errors.Is(err, store.ErrNotInteger):
		code = codes.InvalidArgument
	case errors.Is(err, ErrRankHeld):
		code = codes.AlreadyExists
	case errors.Is(err, ErrUnknown), errors.Is(err, store.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, store.ErrTooLarge):
		code = codes.ResourceExhausted
	case errors.Is(err, store.ErrReplayed):
		code = codes.FailedPrecondition
	}
	return status.Error(code, err.Error())
}

type service struct {
	masterpb.UnimplementedMasterServer
	s *Server
}

func nodeInfo(n *masterpb.Node) (NodeInfo, error) {
	if n == nil {
		return NodeInfo{}, fmt.Errorf("%w: no node", ErrInvalid)
	}
	return NodeInfo{Pod: n.GetPod(), Incarnation: n.GetIncarnation(), Rank: int(n.GetRank()),
		LocalWorldSize: int(n.GetLocalWorldSize()), Addr: n.GetAddr(), Port: int(n.GetPort()), Host: n.GetHost()}, nil
}

func waitOf(ms int64) time.Duration {
	d := time.Duration(ms) * time.Millisecond
	if d < 0 {
		d = 0
	}
	return min(d, maxWait)
}

// holdOf is how long a Join or Heartbeat may be held: what the agent asked
// for, and at most half the heartbeat timeout. A node is seen when its call
// arrives, not while the call is held, so a longer hold would have a
// waiting node declared lost while it waits (a replacement whose round
// cannot form yet, with a 30 s join poll and an 8 s timeout).
func (s *Server) holdOf(ms int64) time.Duration {
	d := waitOf(ms)
	if t := s.job.cfg.HeartbeatTimeout / 2; t > 0 {
		d = min(d, t)
	}
	return d
}

func joinPB(a JoinAnswer, cfg Config, latest int64) *masterpb.JoinResponse {
	r := &masterpb.JoinResponse{Rank: int32(a.Rank)}
	switch {
	case a.Round != nil:
		x := a.Round
		r.Outcome = &masterpb.JoinResponse_Round{Round: &masterpb.Round{Number: x.Number, RunId: cfg.JobID,
			GroupRank: int32(x.GroupRank), GroupWorldSize: int32(x.GroupWorldSize), WorldSize: int32(x.WorldSize),
			FirstGlobalRank: int32(x.FirstGlobalRank), LocalWorldSize: int32(x.LocalWorldSize),
			MasterAddr: x.MasterAddr, MasterPort: int32(x.MasterPort), Departed: int32(x.Departed),
			DepartedKnown: x.DepartedKnown, DepartedSinceUnixNano: masterpb.UnixNano(x.DepartedSince)}}
	case a.Check != nil:
		t := a.Check
		r.Outcome = &masterpb.JoinResponse_Check{Check: &masterpb.CheckTask{Check: t.Check, Round: int32(t.Round),
			Group: int32(t.Group), GroupRank: int32(t.GroupRank), GroupSize: int32(t.GroupSize),
			LeaderAddr: t.LeaderAddr, LeaderPort: int32(t.LeaderPort), TimeoutMs: t.Timeout.Milliseconds()}}
	case a.Excluded != nil:
		r.Outcome = &masterpb.JoinResponse_Excluded{Excluded: exclusionPB(a.Excluded)}
	default:
		r.Outcome = &masterpb.JoinResponse_Pending{Pending: &masterpb.Pending{Waiting: int32(a.Waiting),
			MinNodes: int32(cfg.MinNodes), MaxNodes: int32(cfg.MaxNodes), LatestRound: latest}}
	}
	return r
}

func (v *service) Join(ctx context.Context, req *masterpb.JoinRequest) (*masterpb.JoinResponse, error) {
	s := v.s
	n, err := nodeInfo(req.GetNode())
	if err != nil {
		return nil, grpcError(err)
	}
	after := req.GetAfterRound()
	c := newCall(nil)
	c.apply = func(s *Server, now time.Time) {
		a, err := s.job.Join(n, after, now)
		if err != nil {
			c.finish(nil, err)
			return
		}
		if !a.Pending() || req.GetWaitMs() <= 0 {
			c.finish(joinPB(a, s.job.cfg, s.job.latestNumber()), nil)
			return
		}
		rank := a.Rank
		c.eval = func(s *Server) bool {
			a := s.job.Answer(n.Pod, n.Incarnation, rank, after)
			if a.Pending() {
				return false
			}
			return c.finish(joinPB(a, s.job.cfg, s.job.latestNumber()), nil)
		}
		s.joinWaiters[rank] = append(s.joinWaiters[rank], c)
	}
	res, err := s.do(ctx, c, s.holdOf(req.GetWaitMs()), func() (any, error) {
		cfg := s.job.cfg // immutable after start
		return &masterpb.JoinResponse{Rank: n.Rank32(), Outcome: &masterpb.JoinResponse_Pending{Pending: &masterpb.Pending{
			MinNodes: int32(cfg.MinNodes), MaxNodes: int32(cfg.MaxNodes)}}}, nil
	})
	if err != nil {
		return nil, grpcError(err)
	}
	return res.(*masterpb.JoinResponse), nil
}

// Rank32 is the rank as the protocol carries it.
func (n NodeInfo) Rank32() int32 { return int32(n.Rank) }

func (v *service) ReportCheck(ctx context.Context, req *masterpb.ReportCheckRequest) (*masterpb.ReportCheckResponse, error) {
	n, err := nodeInfo(req.GetNode())
	if err != nil {
		return nil, grpcError(err)
	}
	c := newCall(nil)
	c.apply = func(s *Server, now time.Time) {
		err := s.job.ReportCheck(n, req.GetCheck(), int(req.GetRound()), CheckReport{OK: req.GetOk(), Self: req.GetSelfFailed(),
			Elapsed: time.Duration(req.GetElapsedNs()), Ready: time.Duration(req.GetReadyNs()), Message: req.GetMessage()}, now)
		c.finish(&masterpb.ReportCheckResponse{}, err)
	}
	res, err := v.s.do(ctx, c, 0, nil)
	if err != nil {
		return nil, grpcError(err)
	}
	return res.(*masterpb.ReportCheckResponse), nil
}

func heartbeatPB(a HeartbeatAnswer) *masterpb.HeartbeatResponse {
	r := &masterpb.HeartbeatResponse{LatestRound: a.LatestRound, Exit: exclusionPB(a.Exit)}
	switch a.Action {
	case Restart:
		r.Action = masterpb.HeartbeatResponse_RESTART
	case Exit:
		r.Action = masterpb.HeartbeatResponse_EXIT
	}
	return r
}

func (v *service) Heartbeat(ctx context.Context, req *masterpb.HeartbeatRequest) (*masterpb.HeartbeatResponse, error) {
	s := v.s
	n, err := nodeInfo(req.GetNode())
	if err != nil {
		return nil, grpcError(err)
	}
	round := req.GetRound()
	c := newCall(nil)
	c.apply = func(s *Server, now time.Time) {
		a, err := s.job.Heartbeat(n, round, req.GetStep(), now)
		if err != nil || a.Action != Continue || req.GetWaitMs() <= 0 {
			c.finish(heartbeatPB(a), err)
			return
		}
		rank := n.Rank
		if rank < 0 {
			rank = s.job.byPod[n.Pod]
		}
		c.eval = func(s *Server) bool {
			a := s.job.HeartbeatAnswer(n.Pod, n.Incarnation, rank, round)
			if a.Action == Continue {
				return false
			}
			return c.finish(heartbeatPB(a), nil)
		}
		s.hbWaiters[rank] = append(s.hbWaiters[rank], c)
	}
	res, err := s.do(ctx, c, s.holdOf(req.GetWaitMs()), func() (any, error) {
		return &masterpb.HeartbeatResponse{}, nil
	})
	if err != nil {
		return nil, grpcError(err)
	}
	return res.(*masterpb.HeartbeatResponse), nil
}

func (v *service) Leave(ctx context.Context, req *masterpb.LeaveRequest) (*masterpb.LeaveResponse, error) {
	n, err := nodeInfo(req.GetNode())
	if err != nil {
		return nil, grpcError(err)
	}
	f := req.GetFailure()
	if !req.GetSucceeded() && f == nil {
		return nil, grpcError(fmt.Errorf("%w: a failed node must say its failure", ErrInvalid))
	}
	c := newCall(nil)
	c.apply = func(s *Server, now time.Time) {
		d, err := s.job.Leave(n, req.GetSucceeded(), kferrors.Failure{Code: f.GetCode(), Message: f.GetMessage(),
			Recoverable: f.GetRecoverable(), Time: masterpb.Time(f.GetTimeUnixNano())}, now)
		if err != nil {
			c.finish(nil, err)
			return
		}
		res := &masterpb.LeaveResponse{}
		if d.Seq != 0 {
			res.Decision = DecisionPB(d)
			res.Relaunch = d.Kind != DecisionKind(0) && d.Kind != StopJob
		}
		c.finish(res, nil)
	}
	res, err := v.s.do(ctx, c, 0, nil)
	if err != nil {
		return nil, grpcError(err)
	}
	return res.(*masterpb.LeaveResponse), nil
}

func (v *service) Status(ctx context.Context, _ *masterpb.StatusRequest) (*masterpb.StatusResponse, error) {
	res, err := v.s.Status(ctx)
	return res, grpcError(err)
}

// Status is the job as the master sees it.
func (s *Server) Status(ctx context.Context) (*masterpb.StatusResponse, error) {
	c := newCall(nil)
	c.apply = func(s *Server, now time.Time) {
		j := s.job
		r := &masterpb.StatusResponse{Job: j.cfg.JobID, MinNodes: int32(j.cfg.MinNodes), MaxNodes: int32(j.cfg.MaxNodes)}
		r.Stopped, r.StopReason = j.Stopped()
		if l := j.latest; l != nil {
			r.Round = l.Number
			for _, rank := range l.Ranks {
				r.RoundRanks = append(r.RoundRanks, int32(rank))
			}
		}
		for _, n := range j.Nodes() {
			r.Nodes = append(r.Nodes, &masterpb.NodeStatus{Rank: int32(n.Rank), Pod: n.Pod, Host: n.Host,
				State: string(n.State), Round: n.Round, Relaunches: int32(n.Relaunches), Checked: n.Checked,
				LastSeenUnixNano: masterpb.UnixNano(n.LastSeen), Step: n.Step})
		}
		for _, d := range j.decisions {
			r.Decisions = append(r.Decisions, DecisionPB(d))
		}
		c.finish(r, nil)
	}
	res, err := s.do(ctx, c, 0, nil)
	if err != nil {
		return nil, err
	}
	return res.(*masterpb.StatusResponse), nil
}

// ---- torch store ----

func (v *service) Store(ctx context.Context, req *masterpb.StoreRequest) (*masterpb.StoreResponse, error) {
	s := v.s
	if len(req.GetClient()) > store.MaxClientID {
		return nil, grpcError(fmt.Errorf("%w: client id longer than %d bytes", ErrInvalid, store.MaxClientID))
	}
	if w := req.GetWait(); w != nil {
		return v.wait(ctx, req.GetClient(), w)
	}
	op, err := storeOp(req)
	if err != nil {
		return nil, grpcError(err)
	}
	c := newCall(nil)
	c.apply = func(s *Server, now time.Time) {
		s.metrics.storeOps.WithLabelValues(op.Kind.String()).Inc()
		res, _, err := s.store.Apply(req.GetClient(), req.GetSeq(), op)
		if err != nil {
			c.finish(nil, err)
			return
		}
		c.finish(storeResultPB(res), nil)
	}
	res, err := s.do(ctx, c, 0, nil)
	if err != nil {
		return nil, grpcError(err)
	}
	return res.(*masterpb.StoreResponse), nil
}

func storeOp(req *masterpb.StoreRequest) (store.Op, error) {
	switch x := req.GetOp().(type) {
	case *masterpb.StoreRequest_Set:
		return store.Op{Kind: store.Set, Key: x.Set.GetKey(), Value: x.Set.GetValue()}, nil
	case *masterpb.StoreRequest_Get:
		return store.Op{Kind: store.Get, Key: x.Get.GetKey()}, nil
	case *masterpb.StoreRequest_Add:
		return store.Op{Kind: store.Add, Key: x.Add.GetKey(), Delta: x.Add.GetDelta()}, nil
	case *masterpb.StoreRequest_CompareSet:
		return store.Op{Kind: store.CompareSet, Key: x.CompareSet.GetKey(), Expected: x.CompareSet.GetExpected(),
			Desired: x.CompareSet.GetDesired()}, nil
	case *masterpb.StoreRequest_Check:
		return store.Op{Kind: store.Check, Keys: x.Check.GetKeys()}, nil
	case *masterpb.StoreRequest_Delete:
		return store.Op{Kind: store.Delete, Key: x.Delete.GetKey()}, nil
	case *masterpb.StoreRequest_NumKeys:
		return store.Op{Kind: store.NumKeys}, nil
	case *masterpb.StoreRequest_Append:
		return store.Op{Kind: store.Append, Key: x.Append.GetKey(), Value: x.Append.GetValue()}, nil
	case *masterpb.StoreRequest_MultiGet:
		return store.Op{Kind: store.MultiGet, Keys: x.MultiGet.GetKeys()}, nil
	case *masterpb.StoreRequest_MultiSet:
		return store.Op{Kind: store.MultiSet, Keys: x.MultiSet.GetKeys(), Values: x.MultiSet.GetValues()}, nil
	}
	return store.Op{}, fmt.Errorf("%w: no store operation", ErrInvalid)
}

// wait answers once every key exists, or DEADLINE_EXCEEDED after the
// timeout (TCPStore's WAIT).
func (v *service) wait(ctx context.Context, client string, w *masterpb.StoreWait) (*masterpb.StoreResponse, error) {
	s := v.s
	keys := w.GetKeys()
	if len(keys) == 0 || len(keys) > 1<<16 {
		return nil, grpcError(fmt.Errorf("%w: wait needs 1 to 65536 keys", ErrInvalid))
	}
	timeout := maxWait
	if t := w.GetTimeoutMs(); t > 0 {
		timeout = min(time.Duration(t)*time.Millisecond, maxWait)
	}
	c := newCall(nil)
	var register func(s *Server)
	c.eval = func(s *Server) bool {
		if s.store.Ready(keys) {
			return c.finish(&masterpb.StoreResponse{Ok: true}, nil)
		}
		register(s)
		return false
	}
	register = func(s *Server) {
		for _, k := range keys {
			if !s.store.Ready([]string{k}) {
				s.storeWaiters[k] = append(s.storeWaiters[k], c)
				return // one missing key is enough to wait on; re-checked when it comes
			}
		}
	}
	c.apply = func(s *Server, now time.Time) {
		s.metrics.storeOps.WithLabelValues("wait").Inc()
		c.eval(s)
	}
	res, err := s.do(ctx, c, timeout, func() (any, error) {
		return nil, status.Errorf(codes.DeadlineExceeded, "wait for %d keys timed out after %s", len(keys), timeout)
	})
	if err != nil {
		return nil, grpcError(err)
	}
	return res.(*masterpb.StoreResponse), nil
}

func (v *service) CloseStoreSession(ctx context.Context, req *masterpb.CloseStoreSessionRequest) (*masterpb.CloseStoreSessionResponse, error) {
	c := newCall(nil)
	c.apply = func(s *Server, now time.Time) {
		s.store.CloseSession(req.GetClient())
		c.finish(&masterpb.CloseStoreSessionResponse{}, nil)
	}
	res, err := v.s.do(ctx, c, 0, nil)
	if err != nil {
		return nil, grpcError(err)
	}
	return res.(*masterpb.CloseStoreSessionResponse), nil
}
