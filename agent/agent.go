package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kfelastic/kfelastic/agent/guardian"
	kferrors "github.com/kfelastic/kfelastic/errors"
	podevents "github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/internal/nonblocking"
	"github.com/kfelastic/kfelastic/internal/stopsignal"
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
	return fmt.Sprintf("%s (worker %s, exit %d)", kferrors.Headline(e.Failure.Code, kferrors.OneLine(e.Failure.Message)), e.Failure.Worker, e.Code)
}

// ExitCode is the process exit status for the command.
func (e *ExitError) ExitCode() int { return e.Code }

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
	// (agent/guardian).
	agentID := guardian.NewAgentID()
	var guard *guardian.Guardian
	if !cfg.noGuardian {
		guard, err = guardian.Start(agentID, filepath.Join(runDir, "guardian.log"))
		if err != nil {
			log.Warn("no guardian: processes the workers start may outlive a SIGKILLed agent", "err", err)
		}
	}
	defer guard.Stop()

	// The agent keeps working after ctx ends (dump, stop, document).
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	l := &loop{cfg: cfg, log: log, runDir: runDir, work: work, events: make(chan Event, 16), calls: make(chan func(), 16),
		out: &tee{}, evlog: evlog, agentID: agentID, guard: guard}
	l.oom = startOOMClock(work, oomCounterPath(), oomClockInterval)
	// cleanup first, so that it runs last, after any early return below.
	defer l.cleanup()
	if cfg.command() {
		c, err := newCommandGroups(l)
		if err != nil {
			return fmt.Errorf("store relay: %w", err)
		}
		l.starter = c
	} else {
		l.starter = newWorkerGroups(l)
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
	return l.run(ctx)
}

// loop is the I/O shell around the Policy: it carries out actions and turns
// what happens (exits, rendezvous answers, signals, deadlines) into events.
type loop struct {
	cfg    Config
	log    *slog.Logger
	runDir string
	addr   string
	work   context.Context
	events chan Event
	// calls are work that the loop's parts ask it to do on its own
	// goroutine, between events (call).
	calls chan func()
	out   *tee
	// evlog appends the pod's events (group started, worker exited,
	// restart, pod failed) next to its error documents.
	evlog *eventLog
	// oom dates the pod's OOM kills (oomClock); nil where none can be read.
	oom *oomClock

	policy    *Policy
	group     *group
	rdzvStop  context.CancelFunc
	watchStop context.CancelFunc
	// starter starts each attempt's group: the agent's own workers
	// (workerGroups) or --launcher command's child (commandGroups).
	starter groupStarter
	// groupStarted is when the current group was started.
	groupStarted time.Time

	pendingDoc kferrors.Failure
	docKey     string
	// commandDoc is the document the command wrote itself (flytekit), as
	// the pod's document write found and refined it; nil if none was.
	commandDoc *kferrors.Failure
	// pending are events the loop made itself (workers that failed to
	// start, or were not started), stepped before it waits again.
	pending []Event
	// stopping is closed by a stop signal (Run's ctx).
	stopping <-chan struct{}
	// agentID marks the workers' processes; guard is the guardian, nil
	// without one (agent/guardian).
	agentID string
	guard   *guardian.Guardian
	// superseding is the background move of documents that a group start
	// made stale (kferrors.Supersede); cleanup waits for it.
	superseding sync.WaitGroup
}

func (l *loop) send(ev Event) bool {
	select {
	case l.events <- ev:
		return true
	case <-l.work.Done():
		return false
	}
}

// call runs f on the loop's goroutine, between events; f is dropped once
// the loop is gone.
func (l *loop) call(f func()) {
	select {
	case l.calls <- f:
	case <-l.work.Done():
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
		case f := <-l.calls:
			f()
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
		if l.group != nil {
			// A round after a group's: under --launcher command the child
			// runs on, in a round the master outdated.
			l.starter.roundOutdated(time.Now())
		}
		l.join()
	case StartGroup:
		l.start(a)
	case WatchRound:
		l.starter.roundCompleted(a.Round)
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
		// A pod that wrote a document found and refined the command's own
		// there (upload), however it ended; one that exits 0 looks for it
		// here. A stop (preemption, hang, the master's EXIT) keeps its own
		// code for the master: the command's document only stands for the
		// pod in storage.
		if l.cfg.command() && (a.Code == 0 || strings.HasPrefix(l.pendingDoc.Worker, l.cfg.Pod+"/")) {
			f, key, ok := l.commandFound()
			if ok {
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
			Message: kferrors.OneLine(f.Message)})
		l.log.Error("pod failed", "code", f.Code, "worker", f.Worker, "time", f.Time, "exit_code", a.Code,
			"restart_count", l.policy.RestartCount())
		return true, &ExitError{Code: code, Failure: f, Document: l.docKey}
	}
	return false, nil
}

// commandFound is the command's own document of this attempt: the one the
// pod's document write found, else the one found now
// (refineCommandDocument).
func (l *loop) commandFound() (kferrors.Failure, string, bool) {
	if l.commandDoc != nil {
		return *l.commandDoc, l.docKey, true
	}
	return l.refineCommandDocument()
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
		Message: kferrors.OneLine(f.Message)})
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
			l.send(RendezvousFailed{Code: excluded.Code, Message: excluded.Message, NoRelaunch: !excluded.Relaunch, Permanent: excluded.Permanent})
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

// start starts attempt a's group (its starter's part: the agent's workers or
// --launcher command's child), notes it in the pod's events and watches the
// round's membership.
func (l *loop) start(a StartGroup) {
	r := a.Round
	l.groupStarted = time.Now()
	l.supersede(l.groupStarted)
	var notStarted []WorkerExited
	l.group, notStarted = l.starter.start(a)
	for _, we := range notStarted {
		l.pending = append(l.pending, we)
	}
	l.evlog.append(podevents.Event{Time: l.groupStarted, Pod: l.cfg.Pod, Kind: podevents.GroupStarted, Attempt: a.Attempt,
		RestartCount: a.RestartCount, Round: r.Number, WorldSize: r.WorldSize})
	l.watch(r)
}

// groupStart is what every group's start shares: the pod's command and
// folders, the tee, the OOM count so far, the guardian, the loop's events.
func (l *loop) groupStart(workers int) groupStart {
	gs := groupStart{command: l.cfg.Command, runDir: l.runDir, pod: l.cfg.Pod, workers: workers, out: l.out,
		send: l.send, agentID: l.agentID, guard: l.guard, stop: l.stopping, oom: l.oom, log: l.log}
	gs.oomBaseline, gs.oomKnown = oomKills()
	return gs
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

// cleanup leaves nothing behind: no rendezvous call, no worker, no process
// group, nothing the starter keeps (fork server, spares, store relay). The
// policy only exits once all workers ended, so the SIGKILL is for the paths
// where Run returns early.
func (l *loop) cleanup() {
	l.stopWatch()
	if l.rdzvStop != nil {
		l.rdzvStop()
	}
	if l.group != nil {
		l.group.signal(syscall.SIGKILL)
		l.group.stopProxy()
	}
	if l.starter != nil {
		l.starter.stop()
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
		ev.Code, ev.Message = kferrors.CodeStartFailed, kferrors.OneLine(we.StartError)
	case e.ExitCode != 0 || e.Signal != 0 || e.TorchError != nil || e.OOM:
		f := kferrors.Classify(e)
		ev.Code, ev.Message = f.Code, kferrors.OneLine(f.Message)
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
		attrs = append(attrs, "error", kferrors.OneLine(e.TorchError.Message), "error_time", e.TorchError.Time)
	}
	if e.OOM {
		attrs = append(attrs, "oom", true)
	}
	if we.StartError != "" {
		attrs = append(attrs, "start_error", we.StartError)
	}
	l.log.Info("worker exited", attrs...)
}
