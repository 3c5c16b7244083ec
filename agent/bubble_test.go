package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/nonblocking"
	"github.com/kfelastic/kfelastic/internal/test/mastertest"
	"github.com/kfelastic/kfelastic/master"
)

// The tests of the agent's loop whose subject is time (the hang watchdog,
// the stop grace, the dump window, a restart the master asks for on the
// heartbeat long poll, a master unreachable for longer than Unreachable,
// the pend timeout of a replacement whose rank is held) run Run inside a
// testing/synctest bubble: the policy's deadlines, the master client's
// heartbeats and retries and the master's own timers all run on the
// bubble's clock, which moves only when every goroutine of the bubble
// waits, so that the tests assert virtual durations exactly, where the
// real-process tests can only bound them on a loaded machine.
//
// What differs from production: the master (a real one, gRPC included)
// is reached over an in-memory pipe (MasterConfig.Dialer,
// mastertest.StartInBubble), since a bubble cannot wait on a TCP socket
// durably; and the workers are in-process stand-ins (fakeWorkers, behind
// the launcher seam: Config.launcher), because processes cannot run inside
// a synctest bubble: a goroutine blocked on a process or its pipes is not
// durably blocked, and the bubble's clock would stop. For the same reasons
// the agent runs without its guardian process (Config.noGuardian), fork
// server and store proxy. The real-process tests (agent_test.go,
// process_test.go, masterclient_test.go, torch_test.go) remain: exec, the
// workers' output, process groups, the guardian and the delivery of
// signals are theirs.

// bubble runs f in a synctest bubble. The process's signal handling starts
// first, outside any bubble: Run's first nonblocking.Output catches SIGPIPE
// (os/signal), whose watcher, started once per process, must not be a
// bubble's.
func bubble(t *testing.T, f func(t *testing.T)) {
	nonblocking.CloseOutputs(time.Second, nonblocking.NewOutput(io.Discard))
	synctest.Test(t, f)
}

// fakeWorkers is a launcher whose workers are in-process stand-ins: nothing
// runs; a stand-in lives until the test ends it (Exit) or a signal it does
// not survive arrives.
type fakeWorkers struct {
	// survives are the signals the stand-ins live through (SIGKILL never
	// is): a worker that ignores SIGTERM, one that goes on after its dump.
	survives []syscall.Signal

	mu  sync.Mutex
	all []*fakeWorker // in start order
	// started gets every stand-in as it starts.
	started chan *fakeWorker
}

func newFakeWorkers(survives ...syscall.Signal) *fakeWorkers {
	return &fakeWorkers{survives: survives, started: make(chan *fakeWorker, 64)}
}

// fakeWorker is one worker's stand-in.
type fakeWorker struct {
	w       *worker
	gs      groupStart
	env     []string
	started time.Time
	l       *fakeWorkers

	mu      sync.Mutex
	signals []signalAt
	ended   bool
}

// signalAt is a signal a stand-in got, and when (the bubble's clock).
type signalAt struct {
	Signal syscall.Signal
	At     time.Time
}

func (s signalAt) String() string {
	return fmt.Sprintf("%s at %s", unix.SignalName(s.Signal), s.At.Format("15:04:05.000"))
}

var _ launcher = (*fakeWorkers)(nil)

// launch starts w's stand-in: it "prints" its first line as it starts, as
// a worker's progress clock starts with its start.
func (l *fakeWorkers) launch(gs groupStart, w *worker, env []string) (*worker, error) {
	s := &fakeWorker{w: w, gs: gs, env: env, started: time.Now(), l: l}
	now := s.started.UnixNano()
	w.startedAt.Store(now)
	w.lastOutput.Store(now)
	w.active.Store(true)
	w.signaler = s.signal
	l.mu.Lock()
	l.all = append(l.all, s)
	l.mu.Unlock()
	l.started <- s
	return w, nil
}

// signal is the group's signal to the stand-in's "process".
func (s *fakeWorker) signal(sig syscall.Signal) {
	s.mu.Lock()
	s.signals = append(s.signals, signalAt{sig, time.Now()})
	s.mu.Unlock()
	if sig == syscall.SIGKILL || !slices.Contains(s.l.survives, sig) {
		s.end(sig, 0)
	}
}

// Exit ends the stand-in by itself with code.
func (s *fakeWorker) Exit(code int) { s.end(0, code) }

// Print is an output line: progress, for the hang watchdog.
func (s *fakeWorker) Print() { s.w.lastOutput.Store(time.Now().UnixNano()) }

// Signals are the signals it got so far.
func (s *fakeWorker) Signals() []signalAt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.signals)
}

// Env is the value of key in its environment.
func (s *fakeWorker) Env(key string) string {
	for _, kv := range s.env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// end is the stand-in's end, as worker.wait reports a process's: the
// event is sent from a goroutine of its own, as a process ends beside the
// loop (signal is called on the loop's goroutine).
func (s *fakeWorker) end(sig syscall.Signal, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.ended = true
	s.w.exited.Store(true)
	ev := WorkerExited{Attempt: s.w.attempt, LocalRank: s.w.localRank, from: s.w, Exit: kferrors.WorkerExit{
		Worker: s.w.name, ObservedAt: time.Now(), StartedAt: s.started, Signal: sig, ExitCode: code}}
	go s.gs.send(ev)
}

// next is the next stand-in to start; the test fails if none starts within
// limit (the bubble's clock).
func (l *fakeWorkers) next(t *testing.T, limit time.Duration) *fakeWorker {
	t.Helper()
	select {
	case s := <-l.started:
		return s
	case <-time.After(limit):
		t.Fatalf("no worker started within %v", limit)
		return nil
	}
}

// bubbleConfig is an agent of nproc stand-in workers on one node (Single),
// logging to out, with no process of its own: no guardian, fork server or
// store proxy. The command is the test binary, never run.
func bubbleConfig(t *testing.T, nproc int, l *fakeWorkers) (Config, *syncBuffer) {
	out := &syncBuffer{}
	return Config{
		Command: []string{os.Args[0]}, NProcPerNode: nproc, MinNodes: 1, MaxNodes: 1, NodeRank: -1,
		RdzvID: "bubble", LogDir: t.TempDir(), Pod: "pod-0", StopGrace: 7 * time.Second,
		Stdout: out, Stderr: out, Env: []string{"PATH=" + os.Getenv("PATH")}, MasterAddr: "127.0.0.1",
		NoForkServer: true, NoStoreProxy: true, Logger: slog.New(slog.NewTextHandler(out, nil)),
		launcher: l, noGuardian: true,
	}, out
}

// agentRun is an agent running in the background.
type agentRun struct {
	done chan struct{}
	err  error
}

// runInBubble runs the agent in the background. The test's end waits for
// it (ctx should end with the test's): the bubble's clock stops once the
// test's own goroutine has returned, and Run must not be left waiting on
// it.
func runInBubble(t *testing.T, ctx context.Context, cfg Config) *agentRun {
	r := &agentRun{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = Run(ctx, cfg)
	}()
	t.Cleanup(func() { <-r.done })
	return r
}

// wait returns Run's result.
func (r *agentRun) wait() error {
	<-r.done
	return r.err
}

// ended reports whether Run returned.
func (r *agentRun) ended() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// exitError is Run's *ExitError; the test fails for another result.
func exitError(t *testing.T, err error, out *syncBuffer) *ExitError {
	t.Helper()
	var ee *ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("Run: %v, want an *ExitError\n%s", err, out)
	}
	return ee
}

func wantSignals(t *testing.T, s *fakeWorker, want ...signalAt) {
	t.Helper()
	if got := s.Signals(); !slices.Equal(got, want) {
		t.Errorf("worker %s of attempt %d got %v, want %v", s.w.name, s.w.attempt, got, want)
	}
}

// A worker silent for --hang-timeout fails the pod with Hang: at exactly
// its last sign of life + the timeout every worker gets SIGTERM, and those
// that ignore it SIGKILL exactly the stop grace later. A worker that spoke
// meanwhile is not the hung one.
func TestBubbleHangStoppedThenKilled(t *testing.T) {
	bubble(t, func(t *testing.T) {
		l := newFakeWorkers(syscall.SIGTERM) // they ignore SIGTERM
		cfg, out := bubbleConfig(t, 2, l)
		cfg.HangTimeout, cfg.StopGrace = 90*time.Second, 7*time.Second
		start := time.Now()
		done := runInBubble(t, t.Context(), cfg)
		w0, w1 := l.next(t, time.Second), l.next(t, time.Second)
		if !w0.started.Equal(start) || !w1.started.Equal(start) {
			t.Fatalf("workers started at %v and %v, want at once (%v)", w0.started, w1.started, start)
		}
		time.Sleep(60 * time.Second)
		w1.Print()
		ee := exitError(t, done.wait(), out)
		hung := start.Add(cfg.HangTimeout)
		for _, w := range []*fakeWorker{w0, w1} {
			wantSignals(t, w, signalAt{syscall.SIGTERM, hung}, signalAt{syscall.SIGKILL, hung.Add(cfg.StopGrace)})
		}
		if ee.Code != kferrors.ExitHang || ee.Failure.Code != kferrors.CodeHang || ee.Failure.Worker != "pod-0/0" {
			t.Errorf("got %v (%s of %s), want Hang of pod-0/0, exit %d\n%s", ee, ee.Failure.Code, ee.Failure.Worker, kferrors.ExitHang, out)
		}
		if !ee.Failure.Time.Equal(hung) {
			t.Errorf("Hang dated %v, want its deadline %v", ee.Failure.Time, hung)
		}
	})
}

// SIGTERM to the agent (its context ends) with a dump signal: the workers
// get the dump signal at once, SIGTERM when the dump window (DumpTimeout)
// closes, SIGKILL a stop grace after that; the pod is Preempted, exit 143.
func TestBubblePreemptedDumpThenStop(t *testing.T) {
	bubble(t, func(t *testing.T) {
		l := newFakeWorkers(syscall.SIGUSR1, syscall.SIGTERM)
		cfg, out := bubbleConfig(t, 2, l)
		cfg.DumpSignal, cfg.DumpTimeout, cfg.StopGrace = syscall.SIGUSR1, 20*time.Second, 7*time.Second
		ctx, preempt := context.WithCancel(t.Context())
		defer preempt()
		done := runInBubble(t, ctx, cfg)
		w0, w1 := l.next(t, time.Second), l.next(t, time.Second)
		time.Sleep(30 * time.Second)
		preempted := time.Now()
		preempt()
		ee := exitError(t, done.wait(), out)
		for _, w := range []*fakeWorker{w0, w1} {
			wantSignals(t, w, signalAt{syscall.SIGUSR1, preempted}, signalAt{syscall.SIGTERM, preempted.Add(cfg.DumpTimeout)},
				signalAt{syscall.SIGKILL, preempted.Add(cfg.DumpTimeout + cfg.StopGrace)})
		}
		if ee.Code != 143 || ee.Failure.Code != kferrors.CodePreempted || !ee.Failure.Time.Equal(preempted) {
			t.Errorf("got %v (%s at %v), want Preempted at %v, exit 143\n%s", ee, ee.Failure.Code, ee.Failure.Time, preempted, out)
		}
	})
}

// bubbleAgent is an agent that meets the others through the bubble's
// master b, as `kfelastic agent --rdzv-endpoint` does but over b's pipe.
func bubbleAgent(t *testing.T, b *mastertest.Bubble, pod string, rank int, l *fakeWorkers, mc MasterConfig) (Config, *syncBuffer) {
	t.Helper()
	cfg, out := bubbleConfig(t, 1, l)
	cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = pod, rank, 1, 2
	mc.Endpoint, mc.Token, mc.Host, mc.Dialer, mc.Logger = "pipe", mastertest.Token, pod+"-host", b.Listener.Dial, cfg.Logger
	m, err := DialMaster(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	cfg.Rendezvous = m
	return cfg, out
}

// A node that joins a running job outdates its round: the master answers
// the agent's held heartbeat at once with RESTART, and the agent stops its
// workers (SIGTERM at the join's very instant) and starts them in the new
// round without spending budget.
func TestBubbleMasterRestartThroughHeartbeat(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const hb = 5 * time.Second
		b := mastertest.StartInBubble(t, master.Options{HeartbeatInterval: hb,
			Job: master.Config{JobID: "bubble", MinNodes: 1, MaxNodes: 2, WaitingTimeout: 3 * time.Second}})
		l := newFakeWorkers()
		cfg, out := bubbleAgent(t, b, "job-worker-0", 0, l, MasterConfig{HeartbeatInterval: hb})
		cfg.MaxRestarts = 0 // a membership restart spends none
		start := time.Now()
		done := runInBubble(t, t.Context(), cfg)
		first := l.next(t, time.Minute)
		if d := first.started.Sub(start); d != 3*time.Second {
			t.Errorf("first round's workers started after %v, want the waiting timeout, 3s", d)
		}
		// Heartbeats come and go, held by the master, while nothing changes.
		time.Sleep(7 * hb)
		if s := first.Signals(); len(s) != 0 {
			t.Fatalf("the worker got %v while the round was current\n%s", s, out)
		}
		// A second node joins (the test is its agent).
		conn, err := grpc.NewClient("passthrough:///pipe", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(b.Listener.Dial), grpc.WithPerRPCCredentials(bearer(mastertest.Token)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		joinCtx, stopJoin := context.WithCancel(t.Context())
		defer stopJoin()
		joined := make(chan *masterpb.JoinResponse, 1)
		joinedAt := time.Now()
		go func() {
			res, _ := masterpb.NewMasterClient(conn).Join(joinCtx, &masterpb.JoinRequest{AfterRound: 0, WaitMs: 30_000,
				Node: &masterpb.Node{Pod: "job-worker-1", Incarnation: "i1", Rank: 1, LocalWorldSize: 1, Addr: "127.0.0.2", Port: 2, Host: "h1"}})
			joined <- res
		}()
		second := l.next(t, time.Minute)
		wantSignals(t, first, signalAt{syscall.SIGTERM, joinedAt})
		// Nothing waits between the stop and the new round's start but the
		// group's end, which sweeps its marks twice, 10 ms apart
		// (guardian.Sweep).
		if d := second.started.Sub(joinedAt); d > 100*time.Millisecond || second.w.attempt != 2 {
			t.Errorf("attempt %d started %v after the join, want attempt 2 at once\n%s", second.w.attempt, d, out)
		}
		if rc, gws := second.Env("TORCHELASTIC_RESTART_COUNT"), second.Env("GROUP_WORLD_SIZE"); rc != "0" || gws != "2" {
			t.Errorf("restarted worker: TORCHELASTIC_RESTART_COUNT=%s GROUP_WORLD_SIZE=%s, want 0 and 2", rc, gws)
		}
		if res := <-joined; res.GetRound().GetNumber() != 2 {
			t.Errorf("the second node got %v, want round 2", res)
		}
		second.Exit(0)
		if err := done.wait(); err != nil {
			t.Errorf("Run: %v, want success\n%s", err, out)
		}
	})
}

// bearer is a job token as gRPC per-call credentials.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// A master that goes away is a pause while the workers train: the
// heartbeat retries and nothing times out. The join of the restart after a
// worker's failure retries for MasterConfig.Unreachable, then the pod
// fails with RendezvousTimeout (exit 202): between Unreachable and
// Unreachable plus one retry backoff (at most 2 s plus 50% jitter, which
// is random: the one bound here that is not exact) after the join began.
func TestBubbleMasterUnreachable(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const hb, unreachable = 5 * time.Second, 2 * time.Minute
		b := mastertest.StartInBubble(t, master.Options{HeartbeatInterval: hb,
			Job: master.Config{JobID: "bubble", MinNodes: 1, MaxNodes: 1}})
		l := newFakeWorkers()
		cfg, out := bubbleAgent(t, b, "job-worker-0", 0, l, MasterConfig{HeartbeatInterval: hb, Unreachable: unreachable})
		cfg.MaxRestarts = 1
		done := runInBubble(t, t.Context(), cfg)
		w := l.next(t, time.Minute)
		time.Sleep(30 * time.Second)
		if err := b.Stop(); err != nil {
			t.Fatalf("master: %v", err)
		}
		time.Sleep(3 * unreachable)
		if s := w.Signals(); len(s) != 0 {
			t.Fatalf("the worker got %v while the master was away\n%s", s, out)
		}
		if done.ended() {
			t.Fatalf("the agent ended while its workers trained without the master: %v\n%s", done.err, out)
		}
		failed := time.Now()
		w.Exit(1)
		ee := exitError(t, done.wait(), out)
		d := ee.Failure.Time.Sub(failed)
		if ee.Code != kferrors.ExitRendezvousTimeout || ee.Failure.Code != kferrors.CodeRendezvousTimeout ||
			!strings.Contains(ee.Failure.Message, "unreachable for 2m0s") {
			t.Errorf("got %v: %s, want RendezvousTimeout (master unreachable for 2m0s), exit %d\n%s",
				ee, ee.Failure.Message, kferrors.ExitRendezvousTimeout, out)
		}
		// The stop's end (guardian.Sweep, 10 ms) comes before the join.
		if lo, hi := unreachable, unreachable+3*time.Second+10*time.Millisecond; d < lo || d > hi {
			t.Errorf("the agent gave up %v after the worker failed, want %v to %v", d, lo, hi)
		}
		select {
		case s := <-l.started:
			t.Errorf("attempt %d started without a round", s.w.attempt)
		default:
		}
	})
}

// A replacement pod that joins while the pod it replaces still holds the
// rank waits, and when the old pod still holds it after the master's
// PendTimeout, exits 1 with a RankHeld document; the old pod's workers are
// not disturbed.
func TestBubbleReplacementPendTimeoutRankHeld(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const hb, pend = 5 * time.Second, 3 * time.Minute
		b := mastertest.StartInBubble(t, master.Options{HeartbeatInterval: hb,
			Job: master.Config{JobID: "bubble", MinNodes: 1, MaxNodes: 2, WaitingTimeout: time.Second, PendTimeout: pend}})
		lOld, lNew := newFakeWorkers(), newFakeWorkers()
		oldCfg, oldOut := bubbleAgent(t, b, "job-worker-0", 0, lOld, MasterConfig{HeartbeatInterval: hb})
		newCfg, newOut := bubbleAgent(t, b, "job-worker-3", 0, lNew, MasterConfig{HeartbeatInterval: hb})
		oldCtx, preempt := context.WithCancel(t.Context())
		defer preempt()
		oldDone := runInBubble(t, oldCtx, oldCfg)
		w := lOld.next(t, time.Minute)
		time.Sleep(time.Minute)
		claimed := time.Now()
		newDone := runInBubble(t, t.Context(), newCfg)
		ee := exitError(t, newDone.wait(), newOut)
		if ee.Code != 1 || ee.Failure.Code != kferrors.CodeRankHeld {
			t.Errorf("replacement: %v, want RankHeld, exit 1\n%s", ee, newOut)
		}
		if d := ee.Failure.Time.Sub(claimed); d != pend {
			t.Errorf("the replacement gave up %v after it joined, want the pend timeout, %v\n%s", d, pend, newOut)
		}
		select {
		case s := <-lNew.started:
			t.Errorf("the replacement started attempt %d", s.w.attempt)
		default:
		}
		if s := w.Signals(); len(s) != 0 {
			t.Errorf("the old pod's worker got %v\n%s", s, oldOut)
		}
		preempt()
		if ee := exitError(t, oldDone.wait(), oldOut); ee.Failure.Code != kferrors.CodePreempted {
			t.Errorf("old pod: %v, want Preempted", ee)
		}
	})
}
