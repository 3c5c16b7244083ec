package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kfelastic/kfelastic/agent/forkserver"
	"github.com/kfelastic/kfelastic/agent/guardian"
	"github.com/kfelastic/kfelastic/agent/storeproxy"
	"github.com/kfelastic/kfelastic/agent/storerelay"
	kferrors "github.com/kfelastic/kfelastic/errors"
	podevents "github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/internal/nonblocking"
	"github.com/kfelastic/kfelastic/internal/stopsignal"
	"github.com/kfelastic/kfelastic/internal/termsafe"
)

// ExitError is how Run reports a failed pod: the root cause and the exit
// status the process should end with (see ExitCode).
type ExitError struct {
	Code    int
	Failure kferrors.Failure
	// Document is the key the error document was uploaded under; a local
	// file path (in the run's log folder, where it is always kept) when
	// there is no prefix or storage did not take it within StorageTimeout.
	Document string
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("%s (worker %s, exit %d)", kferrors.Headline(e.Failure.Code, firstLine(e.Failure.Message)), e.Failure.Worker, e.Code)
}

// ExitCode is the process exit status for the command.
func (e *ExitError) ExitCode() int { return e.Code }

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 && len(s)-i < 300 {
		return s[i+1:] // a traceback's last line names the exception
	}
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// Run supervises the workers until they succeed (nil), the pod fails
// (*ExitError, after its document is written), or ctx ends: the end of ctx
// is the agent's SIGTERM (preemption), answered with the dump signal, a
// stop, a Preempted document and an *ExitError with code 143.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	rdzv, closeRdzv, err := cfg.rendezvous()
	if err != nil {
		return err
	}
	defer closeRdzv()
	cfg.Rendezvous = rdzv
	// Never blocked by a reader that does not read (nonblocking.Output);
	// the Outputs made here are closed here.
	var own []io.Writer
	for _, w := range []*io.Writer{&cfg.Stdout, &cfg.Stderr} {
		if o := nonblocking.NewOutput(*w); o != *w {
			*w = o
			own = append(own, o)
		}
	}
	defer nonblocking.CloseOutputs(time.Second, own...)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(cfg.Stderr, nil))
	}
	log := cfg.Logger
	// A prefix that cannot be opened is refused before any worker runs, not
	// discovered when the pod's root cause has to be written. The pod's
	// events go there too.
	evlog, err := openEventLog(ctx, cfg.ErrorPrefix, log, cfg.StorageTimeout)
	if err != nil {
		return fmt.Errorf("--error-prefix: %w", err)
	}
	defer evlog.close()
	if cfg.LogDir == "" {
		d, err := os.MkdirTemp("", "kfelastic_")
		if err != nil {
			return err
		}
		cfg.LogDir = d
	}
	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return fmt.Errorf("log dir: %w", err)
	}
	runDir, err := os.MkdirTemp(cfg.LogDir, cfg.RdzvID+"_")
	if err != nil {
		return fmt.Errorf("log dir: %w", err)
	}
	log.Info("agent starting", "pod", cfg.Pod, "nproc_per_node", cfg.NProcPerNode, "nnodes_min", cfg.MinNodes,
		"nnodes_max", cfg.MaxNodes, "max_restarts", cfg.MaxRestarts, "log_dir", runDir)

	// Nothing the workers start outlives the agent, even a SIGKILLed one
	// (package guardian).
	agentID := guardian.NewAgentID()
	guard, err := guardian.Start(agentID, filepath.Join(runDir, "guardian.log"))
	if err != nil {
		log.Warn("no guardian: processes the workers start may outlive a SIGKILLed agent", "err", err)
	}
	defer guard.Stop()

	// The agent keeps working after ctx ends (dump, stop, document).
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	l := &loop{cfg: cfg, log: log, runDir: runDir, work: work, events: make(chan Event, 16), out: &output{}, evlog: evlog,
		spoke: make(chan *worker, 16), spareTimer: time.NewTimer(time.Hour), agentID: agentID, guard: guard}
	l.spareTimer.Stop()
	l.oom = startOOMClock(work, oomCounterPath(), oomClockInterval)
	// The workers' torch decides which of torchrun's variables they get
	// (WorkerEnv); asked of their interpreter beside the rendezvous.
	l.torchProbe = make(chan string, 1)
	if cfg.Launcher != LauncherCommand {
		go func() { l.torchProbe <- torchVersion(work, cfg.Command, cfg.Env, torchProbeLimit) }()
	} else {
		l.torchProbe <- ""
	}
	if cfg.Tee {
		l.out.stdout, l.out.stderr = cfg.Stdout, cfg.Stderr
	}
	// Where this node's rank-0 worker hosts the store if it becomes group
	// rank 0: --master-addr, else the host's FQDN as torchrun does.
	l.addr = cfg.MasterAddr
	if l.addr == "" {
		l.addr = hostFQDN(ctx)
	}
	// cleanup first, so that it runs last, after any early return below.
	defer l.cleanup()
	// The fork server starts with the first group (forkServer).
	l.forkWanted = !cfg.NoForkServer && !cfg.WarmSpares && cfg.Launcher != "command" && forkable(cfg.Command)
	if cfg.command() {
		relay, err := startCommandRelay(work, cfg.Rendezvous, log)
		if err != nil {
			return fmt.Errorf("store relay: %w", err)
		}
		if relay != nil {
			defer relay.Close()
			l.relay, l.relayAddr = relay, relay.Addr()
		}
	}
	return l.run(ctx)
}

// loop is the I/O shell around the Policy: it carries out actions and turns
// what happens (exits, rendezvous answers, signals, deadlines) into events.
type loop struct {
	// torchProbe brings the workers' torch version (torchVersion) once;
	// torchIs2 is what torch2 made of it.
	torchProbe chan string
	torchOnce  sync.Once
	torchIs2   bool

	cfg    Config
	log    *slog.Logger
	runDir string
	addr   string
	work   context.Context
	events chan Event
	out    *output
	// evlog appends the pod's events (group started, worker exited,
	// restart, pod failed) next to its error documents.
	evlog *eventLog
	// oom dates the pod's OOM kills (oomClock); nil where none can be read.
	oom *oomClock

	policy    *Policy
	group     *group
	rdzvStop  context.CancelFunc
	watchStop context.CancelFunc

	spares []*worker
	// groupStarted is when the current group was started.
	groupStarted time.Time
	// spareFor is the group whose workers must speak before the next
	// spares start; spoke carries first output lines, spareTimer the
	// fallback.
	spareFor   *spareWait
	spoke      chan *worker
	spareTimer *time.Timer

	pendingDoc kferrors.Failure
	docKey     string
	// pending are events the loop made itself (workers that failed to
	// start, or were not started), stepped before it waits again.
	pending []Event
	// stopping is closed by a stop signal (Run's ctx).
	stopping <-chan struct{}
	// agentID marks the workers' processes; guard is the guardian, nil
	// without one (package guardian).
	agentID string
	guard   *guardian.Guardian
	// superseding is the background move of documents that a group start
	// made stale (kferrors.Supersede); cleanup waits for it.
	superseding sync.WaitGroup
	// relay is the store relay (command mode with the master), and
	// outdatedAt when the master outdated the round the command runs in
	// (zero: not since the last round): c10d's dead nodes are forgotten
	// from then on (storerelay.Relay.ForgetLost).
	relay      *storerelay.Relay
	outdatedAt time.Time
	// relayAddr is the store relay's address (--launcher command with the
	// master), the child's PET_RDZV_ENDPOINT.
	relayAddr string
	// fork is the fork server, nil without one, and forkMark its mark;
	// forkStarts counts the servers started, for their marks and the
	// restart limit; forkWanted: the command can be forked and the fork
	// server is not turned off.
	fork       *forkserver.Server
	forkMark   string
	forkStarts int
	forkWanted bool
}

func (l *loop) send(ev Event) bool {
	select {
	case l.events <- ev:
		return true
	case <-l.work.Done():
		return false
	}
}

func (l *loop) run(ctx context.Context) error {
	l.policy = NewPolicy(PolicyConfig{Pod: l.cfg.Pod, LocalWorkers: l.cfg.NProcPerNode, MaxRestarts: l.cfg.MaxRestarts,
		StopGrace: l.cfg.StopGrace, HangTimeout: l.cfg.HangTimeout, DumpSignal: l.cfg.DumpSignal, DumpTimeout: l.cfg.DumpTimeout,
		Command: l.cfg.command()})
	actions := l.policy.Start()
	terminated := ctx.Done()
	l.stopping = ctx.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		for _, a := range actions {
			if done, err := l.do(a); done {
				return err
			}
		}
		actions = nil
		// A stop signal goes before the events left to step: a start it
		// interrupted leaves those of the workers it did not start.
		if terminated != nil && ctx.Err() != nil {
			terminated = nil
			actions = l.terminate(ctx)
			continue
		}
		if len(l.pending) > 0 {
			ev := l.pending[0]
			l.pending = l.pending[1:]
			actions = l.step(ev)
			continue
		}
		timer.Stop()
		var tick <-chan time.Time
		if d := l.policy.Deadline(); !d.IsZero() {
			timer.Reset(time.Until(d))
			tick = timer.C
		}
		select {
		case ev := <-l.events:
			actions = l.step(ev)
		case w := <-l.spoke:
			if sw := l.spareFor; sw != nil && l.group != nil && slices.Contains(l.group.workers, w) {
				sw.spoke[w] = true
				if len(sw.spoke) == l.cfg.NProcPerNode {
					l.startSparesNow()
				}
			}
		case <-l.spareTimer.C:
			l.startSparesNow()
		case <-terminated:
			terminated = nil
			actions = l.terminate(ctx)
		case <-tick:
			now := time.Now()
			if g := l.group; g != nil {
				for _, w := range g.workers {
					actions = append(actions, l.policy.Step(Progress{Attempt: g.attempt, LocalRank: w.localRank, At: w.progress()}, now)...)
				}
			}
			actions = append(actions, l.policy.Step(Tick{}, now)...)
		}
	}
}

// step feeds one event to the policy, after the loop's own part in a
// worker's exit: log it, append its event, and end its group when it was
// the last.
func (l *loop) step(ev Event) []Action {
	if we, ok := ev.(WorkerExited); ok {
		if !l.current(we) {
			return nil // a spare that was never released
		}
		l.logExit(we)
		l.evlog.append(l.exitEvent(we))
		if g := l.group; g != nil && g.attempt == we.Attempt && g.ended() {
			g.end() // the store is gone with rank 0, and all the group started
		}
	}
	return l.policy.Step(ev, time.Now())
}

// terminate feeds the stop signal that ended ctx to the policy.
func (l *loop) terminate(ctx context.Context) []Action {
	sig := stopsignal.Of(ctx)
	l.log.Info("agent got a stop signal", "signal", unix.SignalName(sig), "dump_signal", int(l.cfg.DumpSignal), "dump_timeout", l.cfg.DumpTimeout)
	return l.policy.Step(Terminate{Signal: sig}, time.Now())
}

// do carries out one action; done is true when the agent is finished.
func (l *loop) do(a Action) (done bool, err error) {
	switch a := a.(type) {
	case JoinRound:
		if a.Restart != "" {
			l.evlog.append(podevents.Event{Time: time.Now(), Pod: l.cfg.Pod, Kind: podevents.Restart,
				Attempt: l.policy.Attempt() + 1, RestartCount: a.RestartCount, Reason: a.Restart})
		}
		if l.relay != nil && l.group != nil {
			l.outdatedAt = time.Now() // the command runs: the master outdated its round
		}
		l.join()
	case StartGroup:
		l.start(a)
	case WatchRound:
		l.log.Info("the master completed a round; the command goes on (torch re-rendezvouses through the store itself)",
			"round", a.Round.Number, "group_rank", a.Round.GroupRank, "group_world_size", a.Round.GroupWorldSize)
		if l.relay != nil && !l.outdatedAt.IsZero() {
			go l.forgetLost(l.outdatedAt, a.Round.GroupWorldSize, a.Round.Departed)
		}
		l.outdatedAt = time.Time{}
		l.watch(a.Round)
	case SignalGroup:
		if l.group != nil && l.group.attempt == a.Attempt {
			l.log.Info("signaling workers", "attempt", a.Attempt, "signal", a.Signal.String())
			l.group.signal(a.Signal)
		}
	case WriteDocument:
		l.pendingDoc = a.Failure
		l.docKey = l.write(a.Failure)
	case Exit:
		// Only a command that ended by itself may have written the pod's
		// document; a stop (preemption, hang, the master's EXIT) must not
		// wait on storage once more within the pod's grace period.
		if l.cfg.command() && (a.Code == 0 || strings.HasPrefix(l.pendingDoc.Worker, l.cfg.Pod+"/")) {
			if f, key, ok := l.refineCommandDocument(); ok {
				if a.Code == 0 {
					return l.commandWroteDocument(f, key)
				}
				// The command's own document says more than its exit
				// status: the master and the log get it.
				l.pendingDoc, l.docKey = f, key
			}
		}
		code := l.leave(a.Code)
		if code == 0 {
			l.log.Info("workers succeeded", "restart_count", l.policy.RestartCount())
			l.evlog.append(podevents.Event{Time: time.Now(), Pod: l.cfg.Pod, Kind: podevents.PodSucceeded,
				Attempt: l.policy.Attempt(), RestartCount: l.policy.RestartCount()})
			return true, nil
		}
		f := l.pendingDoc
		// The event has the pod's exit code: the one leave decided.
		l.evlog.append(podevents.Event{Time: time.Now(), Pod: l.cfg.Pod, Kind: podevents.PodFailed, Attempt: l.policy.Attempt(),
			RestartCount: l.policy.RestartCount(), Worker: f.Worker, ExitCode: &code, Code: f.Code, Document: l.docKey,
			Message: firstLine(f.Message)})
		l.log.Error("pod failed", "code", f.Code, "worker", f.Worker, "time", f.Time, "exit_code", a.Code,
			"restart_count", l.policy.RestartCount())
		return true, &ExitError{Code: code, Failure: f, Document: l.docKey}
	}
	return false, nil
}

// commandWroteDocument ends the pod whose command wrote its own error
// document and exited 0, as flytekit's pyflyte-execute does: the pod exits
// 0 as flytekit would have it, but the master (which decides about the
// rank) and the event log hear that it failed, not that it succeeded.
func (l *loop) commandWroteDocument(f kferrors.Failure, key string) (bool, error) {
	l.pendingDoc, l.docKey = f, key
	if lv, ok := l.cfg.Rendezvous.(Leaver); ok {
		lv.Leave(l.work, false, f)
	}
	code := 0
	l.evlog.append(podevents.Event{Time: time.Now(), Pod: l.cfg.Pod, Kind: podevents.PodFailed, Attempt: l.policy.Attempt(),
		RestartCount: l.policy.RestartCount(), Worker: f.Worker, ExitCode: &code, Code: f.Code, Document: key,
		Message: firstLine(f.Message)})
	l.log.Error("the command wrote an error document and exited 0 (flytekit); the pod failed", "code", f.Code,
		"worker", f.Worker, "time", f.Time, "document", key)
	return true, nil
}

// Leaver is a Rendezvous that wants to know how a node ended: the master,
// which decides whether the pod comes back.
type Leaver interface {
	Leave(ctx context.Context, succeeded bool, f kferrors.Failure) (relaunch, known bool)
}

// leave tells the rendezvous how the pod ends and returns the exit code: a
// retryable failure whose pod the master will not relaunch (its budget is
// spent, the job stopped) exits 1, so that the training operator's ExitCode
// policy does not bring it back either.
func (l *loop) leave(code int) int {
	lv, ok := l.cfg.Rendezvous.(Leaver)
	if !ok {
		return code
	}
	relaunch, known := lv.Leave(l.work, code == 0, l.pendingDoc)
	if known && code >= 128 && !relaunch {
		l.log.Info("the master will not relaunch this pod; exiting 1", "would_exit", code)
		return 1
	}
	return code
}

// join asks the rendezvous for the next round in the background; the answer
// comes back as RoundReady or RendezvousFailed. The membership watch of the
// previous round ends first.
func (l *loop) join() {
	l.stopWatch()
	ctx, cancel := context.WithCancel(l.work)
	l.rdzvStop = cancel
	node := NodeInfo{ID: l.cfg.Pod, Rank: l.cfg.NodeRank, LocalWorldSize: l.cfg.NProcPerNode, Addr: l.addr}
	go func() {
		port, err := freePort()
		if err != nil {
			l.send(RendezvousFailed{Message: fmt.Sprintf("no free port for the workers' store: %v", err)})
			return
		}
		node.Port = port
		round, err := l.cfg.Rendezvous.Next(ctx, node)
		var excluded *ExcludedError
		var refused *AuthError
		switch {
		case ctx.Err() != nil:
		case errors.As(err, &excluded):
			l.send(RendezvousFailed{Code: excluded.Code, Message: excluded.Message, NoRelaunch: !excluded.Relaunch})
		case errors.As(err, &refused):
			l.send(RendezvousFailed{Code: kferrors.CodeAuthenticationFailed, Message: refused.Error(), Permanent: true})
		case err != nil:
			l.send(RendezvousFailed{Message: fmt.Sprintf("rendezvous %s: %v", l.cfg.RdzvID, err)})
		default:
			l.send(RoundReady{Round: round})
		}
	}()
}

func (l *loop) stopWatch() {
	if l.watchStop != nil {
		l.watchStop()
		l.watchStop = nil
	}
}

// start prints torchrun's rendezvous block, starts the group and watches the
// round's membership.
func (l *loop) start(a StartGroup) {
	r := a.Round
	if l.cfg.command() {
		l.startCommand(a)
		return
	}
	local := make([]int, l.cfg.NProcPerNode)
	global := make([]int, l.cfg.NProcPerNode)
	sizes := make([]int, l.cfg.NProcPerNode)
	for i := range local {
		local[i], global[i], sizes[i] = i, r.FirstGlobalRank+i, r.WorldSize
	}
	l.out.mu.Lock()
	fmt.Fprintf(l.cfg.Stderr, "[%s] Rendezvous complete for workers. Result:\n"+
		"  restart_count=%d\n  master_addr=%s\n  master_port=%d\n  group_rank=%d\n  group_world_size=%d\n"+
		"  local_ranks=%s\n  role_ranks=%s\n  global_ranks=%s\n  role_world_sizes=%s\n  global_world_sizes=%s\n\n",
		RoleName, a.RestartCount, termsafe.Line(r.MasterAddr), r.MasterPort, r.GroupRank, r.GroupWorldSize,
		pyList(local), pyList(global), pyList(global), pyList(sizes), pyList(sizes))
	l.out.mu.Unlock()
	gs := groupStart{command: l.cfg.Command, baseEnv: l.cfg.Env, runDir: l.runDir, pod: l.cfg.Pod,
		maxRestarts: l.cfg.MaxRestarts, workers: l.cfg.NProcPerNode, out: l.out, send: l.send,
		agentID: l.agentID, guard: l.guard, stop: l.stopping, fork: l.forkServer(), forkMark: l.forkMark, log: l.log,
		torch2: l.torch2()}
	if l.cfg.WarmSpares {
		gs.spoke = func(w *worker) {
			select {
			case l.spoke <- w:
			case <-l.work.Done():
			}
		}
	}
	gs.oomBaseline, gs.oomKnown = oomKills()
	gs.oom = l.oom
	if l.group != nil {
		l.group.stopProxy() // frees the port if the new round reuses it
	}
	var proxy *storeproxy.Proxy
	if !l.cfg.NoStoreProxy && r.GroupRank == 0 {
		proxy, gs.storePort = l.startProxy(r)
	}
	l.groupStarted = time.Now()
	l.supersede(l.groupStarted)
	var notStarted []WorkerExited
	l.group, notStarted = startGroup(gs, a, l.spares)
	for _, we := range notStarted {
		l.pending = append(l.pending, we)
	}
	l.group.proxy = proxy
	for _, w := range l.spares {
		if w != nil && !slices.Contains(l.group.workers, w) {
			w.discard()
		}
	}
	l.spares = nil
	if l.cfg.WarmSpares {
		// The spares wait until every worker has spoken (its imports are
		// done) or spareDelay passed, so that they do not compete with the
		// group's own start for CPU.
		l.spareFor = &spareWait{gs: gs, group: a, spoke: map[*worker]bool{}}
		l.spareTimer.Reset(spareDelay)
	}
	l.log.Info("workers started", "attempt", a.Attempt, "restart_count", a.RestartCount, "round", r.Number,
		"dir", l.group.dir)
	l.evlog.append(podevents.Event{Time: l.groupStarted, Pod: l.cfg.Pod, Kind: podevents.GroupStarted, Attempt: a.Attempt,
		RestartCount: a.RestartCount, Round: r.Number, WorldSize: r.WorldSize})
	l.watch(r)
}

// watch turns the end of round r into a MembershipChanged, in the
// background.
func (l *loop) watch(r Round) {
	l.stopWatch()
	ctx, cancel := context.WithCancel(l.work)
	l.watchStop = cancel
	go func() {
		if err := l.cfg.Rendezvous.Changed(ctx, r.Number); err == nil {
			l.send(MembershipChanged{Round: r.Number})
		}
	}()
}

// startCommand starts --launcher command's one child (command.go) with the
// pod's environment and the relay as PET_RDZV_ENDPOINT. torch's own agent
// in the child prints torchrun's rendezvous block for its workers.
func (l *loop) startCommand(a StartGroup) {
	r := a.Round
	gs := groupStart{command: l.cfg.Command, baseEnv: l.cfg.Env, runDir: l.runDir, pod: l.cfg.Pod,
		workers: 1, out: l.out, send: l.send, agentID: l.agentID, guard: l.guard, stop: l.stopping,
		launch: &commandSpec{cfg: &l.cfg, rdzvEndpoint: l.relayAddr, loopback: l.relayAddr != "" && !hostnameResolves()}}
	gs.oomBaseline, gs.oomKnown = oomKills()
	gs.oom = l.oom
	l.groupStarted = time.Now()
	l.supersede(l.groupStarted)
	var notStarted []WorkerExited
	l.group, notStarted = startGroup(gs, a, nil)
	for _, we := range notStarted {
		l.pending = append(l.pending, we)
	}
	l.log.Info("command started", "attempt", a.Attempt, "round", r.Number, "group_rank", r.GroupRank,
		"group_world_size", r.GroupWorldSize, "rdzv_endpoint", l.relayAddr, "dir", l.group.dir)
	l.evlog.append(podevents.Event{Time: l.groupStarted, Pod: l.cfg.Pod, Kind: podevents.GroupStarted, Attempt: a.Attempt,
		RestartCount: a.RestartCount, Round: r.Number, WorldSize: r.WorldSize})
	l.watch(r)
}

// startProxy starts the group's store proxy on the round's MASTER_PORT and
// returns it with the private port for rank 0's store. If either port is
// unavailable the group runs without a proxy (rank 0 binds MASTER_PORT, as
// under torchrun) and only pays torch's connect retry.
func (l *loop) startProxy(r Round) (*storeproxy.Proxy, int) {
	// The private port stays reserved until the proxy listens, so the two
	// differ; like freePort it is closed before rank 0 binds it.
	hold, err := net.Listen("tcp", ":0")
	if err == nil {
		port := hold.Addr().(*net.TCPAddr).Port
		var p *storeproxy.Proxy
		p, err = storeproxy.Start(r.MasterPort, port, l.log)
		hold.Close()
		if err == nil {
			l.log.Info("store proxy started", "port", r.MasterPort, "rank0_port", port)
			return p, port
		}
	}
	l.log.Warn("no store proxy: rank 0 hosts the store on MASTER_PORT", "port", r.MasterPort, "err", err)
	return nil, 0
}

// pyList formats ints as Python prints a list: [0, 1].
func pyList(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// cleanup leaves nothing behind: no rendezvous call, no worker, no process
// group. The policy only exits once all workers ended, so the SIGKILL is
// for the paths where Run returns early.
func (l *loop) cleanup() {
	l.stopWatch()
	if l.rdzvStop != nil {
		l.rdzvStop()
	}
	if l.group != nil {
		l.group.signal(syscall.SIGKILL)
		l.group.stopProxy()
	}
	if l.fork != nil {
		l.fork.Stop()
	}
	for _, w := range l.spares {
		if w != nil {
			w.discard()
		}
	}
	// Whatever any attempt started and still lives (a daemon of the last
	// one) ends with the agent.
	guardian.Sweep([]string{l.agentID + "/"}, true, nil)
	l.superseding.Wait()
}

// current reports whether an exit event is of a worker of the current group
// (or of an old group, which the policy ignores by attempt), not of a spare.
func (l *loop) current(we WorkerExited) bool {
	if we.from == nil || l.group == nil || we.Attempt != l.group.attempt {
		return true
	}
	return slices.Contains(l.group.workers, we.from)
}

// forgetLostLimit bounds how long a relay watches torch's c10d state for
// its dead nodes after the master outdated a round: past keep_alive_interval
// × keep_alive_max_attempt (15 s by default) torch has forgotten them itself.
const forgetLostLimit = 20 * time.Second

// forgetLost has the relay age the heartbeats of the c10d nodes that were
// lost when the master outdated the command's round (Relay.ForgetLost): live
// nodes are in the master's new round, lost of the round before are not.
func (l *loop) forgetLost(cutoff time.Time, live, lost int) {
	ctx, cancel := context.WithTimeout(l.work, forgetLostLimit)
	defer cancel()
	if n := l.relay.ForgetLost(ctx, cutoff, live, lost); n > 0 {
		l.log.Info("lost nodes forgotten in torch's c10d rendezvous", "nodes", n, "live", live,
			"lost", lost, "after", time.Since(cutoff).Round(time.Millisecond))
	}
}

// torchProbeLimit bounds the torch version probe: an interpreter start,
// under load, without importing torch.
const torchProbeLimit = 30 * time.Second

// torch2 reports whether the workers run torch 2.x; the first call waits for
// the probe.
func (l *loop) torch2() bool {
	l.torchOnce.Do(func() {
		v := <-l.torchProbe
		l.torchIs2 = isTorch2(v)
		if v != "" {
			l.log.Info("workers' torch", "version", v)
		}
	})
	return l.torchIs2
}

// startForkServer starts a fork server (agent/forkserver) for the command's
// interpreter, or goes on without one.
func (l *loop) startForkServer() {
	preload := l.cfg.Preload
	if preload == "" {
		preload = "torch"
	}
	l.forkStarts++
	mark := fmt.Sprintf("%s/fork%d", l.agentID, l.forkStarts)
	logPath := filepath.Join(l.runDir, fmt.Sprintf("forkserver_%d.log", l.forkStarts))
	env := append(serverEnv(l.cfg.Env, l.cfg.NProcPerNode, l.torch2()), guardian.MarkEnv+"="+mark)
	s, err := forkserver.Start(l.cfg.Command[0], env, preload, logPath, l.log)
	if err != nil {
		l.log.Warn("no fork server: workers are started with exec", "err", err)
		return
	}
	l.guard.Register(s.Pid(), true)
	l.fork, l.forkMark = s, mark
	l.log.Info("fork server starting", "pid", s.Pid(), "preload", preload, "log", logPath)
}

// forkServer returns the fork server for the next group, nil for exec; the
// first group starts the first server. A server that refused to fork is
// given up; one that died is replaced, at most maxForkRestarts times, and
// that group is exec'd while the new one imports.
func (l *loop) forkServer() *forkserver.Server {
	if l.forkWanted && l.forkStarts == 0 {
		// Not before the first round: its imports would compete for the
		// CPU with the master's node check, a timing test, and skew it.
		// Started now, with the first group waiting for it, a cold start
		// costs one import and forks, where exec costs one import per
		// worker, side by side.
		l.startForkServer()
	}
	s := l.fork
	if s == nil {
		return nil
	}
	if why := s.Refused(); why != "" {
		l.log.Error("fork server given up: workers are started with exec from now on", "err", why)
		s.Stop()
		l.guard.Register(s.Pid(), false)
		l.fork = nil
		return nil
	}
	if !s.IsDead() {
		return s
	}
	l.guard.Register(s.Pid(), false)
	l.fork = nil
	if !s.IsReady() {
		// It never got as far as forking (an interpreter too old, a broken
		// environment): a new one would not either.
		l.log.Error("fork server died before it was ready: workers are started with exec from now on",
			"its_log", s.LogTail(2048))
		return nil
	}
	if l.forkStarts > maxForkRestarts {
		l.log.Error("fork server died again: workers are started with exec from now on", "servers_started", l.forkStarts)
		return nil
	}
	l.log.Warn("fork server died: starting a new one; this attempt's workers are started with exec", "pid", s.Pid())
	l.startForkServer()
	return nil
}

// maxForkRestarts: a fork server that keeps dying is given up; workers are
// exec'd from then on.
const maxForkRestarts = 3

// spareDelay is the longest the spares wait for the group to speak.
const spareDelay = 10 * time.Second

type spareWait struct {
	gs    groupStart
	group StartGroup
	spoke map[*worker]bool
}

func (l *loop) startSparesNow() {
	sw := l.spareFor
	l.spareFor = nil
	l.spareTimer.Stop()
	if sw == nil || l.policy.Done() || l.group == nil || l.group.attempt != sw.group.Attempt {
		return
	}
	l.startSpares(sw.gs, sw.group)
}

// startSpares starts the next attempt's warm spares (WarmSpares).
func (l *loop) startSpares(gs groupStart, a StartGroup) {
	next := StartGroup{Attempt: a.Attempt + 1, RestartCount: a.RestartCount, Round: a.Round}
	preload := l.cfg.Preload
	if preload == "" {
		preload = "torch"
	}
	l.spares = make([]*worker, l.cfg.NProcPerNode)
	for local := range l.cfg.NProcPerNode {
		select {
		case <-l.stopping:
			return // a stop signal: no next attempt to start spares for
		default:
		}
		probe := newWorker(gs, next.Attempt, local)
		env := WorkerEnv(gs.baseEnv, workerSpec{group: next, localRank: local, localWorkers: gs.workers,
			maxRestarts: gs.maxRestarts, pod: gs.pod, errorFile: probe.errorFile, progressFile: probe.progressFile,
			mark: guardian.AttemptMark(gs.agentID, next.Attempt), torch2: gs.torch2})
		w, err := startSpare(gs, next.Attempt, local, env, preload)
		if err != nil {
			l.log.Warn("no warm spare", "attempt", next.Attempt, "local_rank", local, "err", err)
			continue
		}
		l.spares[local] = w
	}
}

// exitEvent is the event of a worker's exit: its status, and its failure's
// code unless it exited 0; Stopped when the agent was stopping the group
// (the exit is the stop's doing or a secondary failure).
func (l *loop) exitEvent(we WorkerExited) podevents.Event {
	e := we.Exit
	ev := podevents.Event{Time: e.ObservedAt, Pod: l.cfg.Pod, Kind: podevents.WorkerExited, Attempt: we.Attempt,
		Worker: e.Worker, Stopped: l.policy.Stopping()}
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if e.Signal != 0 {
		ev.Signal = unix.SignalName(e.Signal)
	} else {
		code := e.ExitCode
		ev.ExitCode = &code
	}
	switch {
	case we.StartError != "":
		ev.Code, ev.Message = kferrors.CodeStartFailed, firstLine(we.StartError)
	case e.ExitCode != 0 || e.Signal != 0 || e.TorchError != nil || e.OOM:
		f := kferrors.Classify(e)
		ev.Code, ev.Message = f.Code, firstLine(f.Message)
	}
	return ev
}

func (l *loop) logExit(we WorkerExited) {
	e := we.Exit
	attrs := []any{"attempt", we.Attempt, "worker", e.Worker}
	if e.Signal != 0 {
		attrs = append(attrs, "signal", e.Signal.String())
	} else {
		attrs = append(attrs, "exit_code", e.ExitCode)
	}
	if e.TorchError != nil {
		attrs = append(attrs, "error", firstLine(e.TorchError.Message), "error_time", e.TorchError.Time)
	}
	if e.OOM {
		attrs = append(attrs, "oom", true)
	}
	if we.StartError != "" {
		attrs = append(attrs, "start_error", we.StartError)
	}
	l.log.Info("worker exited", attrs...)
}
