package agent

import (
	"fmt"
	"slices"
	"syscall"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// PolicyConfig is what the restart policy needs to know of the agent's flags.
type PolicyConfig struct {
	// Pod names the pod in documents that are about the pod as a whole
	// (Preempted, RendezvousTimeout); worker failures name "<pod>/<local rank>".
	Pod string
	// LocalWorkers is nproc-per-node.
	LocalWorkers int
	// MaxRestarts is the budget of group restarts caused by worker failures.
	MaxRestarts int
	// StopGrace is how long a stopped group gets between SIGTERM and SIGKILL.
	StopGrace time.Duration
	// HangTimeout, when > 0, fails a worker that made no progress for so long.
	HangTimeout time.Duration
	// DumpSignal, when non-zero, is sent to the workers on SIGTERM to the
	// agent; they get DumpTimeout to write a checkpoint before the stop.
	DumpSignal  syscall.Signal
	DumpTimeout time.Duration
	// Command is --launcher command (docs/DESIGN.md §4.4): the one local process is
	// the user's command, which starts and restarts its own workers through
	// torch elastic. The agent never restarts it (MaxRestarts is torch's
	// business inside it, so a failure of the command ends the pod), and a
	// master round that changes does not stop it: torch's own agent
	// re-rendezvouses through the store. The agent only re-joins the master
	// (JoinRound while running, then WatchRound) so that the master's rounds
	// follow the membership and a replacement pod can complete one with the
	// others. A rendezvous that fails meanwhile (the master excluded this
	// node, stopped the job) stops the command and ends the pod with it.
	Command bool
}

// Policy is the agent's restart policy: a deterministic state machine, fed
// events and the time they happened, that answers with actions for the I/O
// loop to carry out. It starts no goroutine and reads no clock, so every
// scenario (testdata/policy/*.txt) replays exactly.
//
// Phases: rendezvous → running → stopping → (rendezvous again | done). A
// worker failure stops the group and spends budget; a membership change stops
// it for free; SIGTERM stops it for good with a Preempted document.
type Policy struct {
	cfg   PolicyConfig
	phase phase

	// restarts is the budget spent (TORCHELASTIC_RESTART_COUNT); attempt
	// counts group starts, including free ones, so that every attempt has its
	// own error files.
	restarts int
	attempt  int
	round    Round

	alive    []bool
	progress []time.Time
	failures []kferrors.Failure
	// restartedFrom is the root cause of the last group restarted in place
	// after its workers failed: a hardware refusal that comes after the
	// restart still documents it (finishExcluded).
	restartedFrom kferrors.Failure
	// unstartable: a worker could not start for a reason a restart does
	// not fix (WorkerExited.Permanent).
	unstartable bool

	reason     stopReason
	terminated time.Time // when SIGTERM arrived, zero if it did not
	signaled   bool      // whether the current group got a stop signal from us
	killAt     time.Time // SIGKILL deadline of a stopping group
	dumpUntil  time.Time // end of the dying-gasp window

	// stopSig is the stop signal that arrived at terminated: SIGTERM for a
	// preemption, or SIGINT, SIGHUP, SIGQUIT (see Terminate).
	stopSig syscall.Signal

	// rejoining (Command): a JoinRound is out while the command runs.
	// excluded is the rendezvous failure that stops it (reasonExcluded),
	// with exitOne when the master does not want the pod back.
	rejoining bool
	excluded  kferrors.Failure
	exitOne   bool
}

type phase int

const (
	phaseRendezvous phase = iota
	phaseRunning
	phaseStopping
	phaseDone
)

func (p phase) String() string {
	return [...]string{"rendezvous", "running", "stopping", "done"}[p]
}

type stopReason int

const (
	reasonNone stopReason = iota
	reasonFailure
	reasonMembership
	reasonTerminate
	// reasonExcluded (Command): the rendezvous failed while the command ran.
	reasonExcluded
)

// Event is an input of the Policy.
type Event interface{ event() }

// RoundReady: the rendezvous completed a round that includes this node.
type RoundReady struct{ Round Round }

// RendezvousFailed: the rendezvous gave up (join or pending timeout), or
// the master told this node to exit. Code is the pod's document's code
// (RendezvousTimeout when empty); NoRelaunch makes the agent exit 1 so that
// the training operator does not bring the pod back (the master does not
// want it). Permanent makes the failure itself NON_RECOVERABLE (the master
// refused the job token: no restart, relaunch or retry can fix it).
type RendezvousFailed struct {
	Message    string
	Code       string
	NoRelaunch bool
	Permanent  bool
}

// WorkerExited: a worker process of group attempt Attempt ended.
type WorkerExited struct {
	Attempt   int
	LocalRank int
	// Exit is what was observed (code, signal, error file, OOM evidence).
	Exit kferrors.WorkerExit
	// StartError is set when the process could not be started at all;
	// Permanent when no restart can start it either (its program or script
	// does not exist): the pod fails without restarting.
	StartError string
	Permanent  bool

	from *worker // which process; the loop drops events of discarded spares
}

// Progress: a worker printed a line or touched its progress file at At.
type Progress struct {
	Attempt   int
	LocalRank int
	At        time.Time
}

// MembershipChanged: a node waits to join (scale up) or a member left; the
// current round is outdated.
type MembershipChanged struct{ Round int }

// Terminate: the agent got a stop signal. SIGTERM (or none) is a
// preemption, eviction or node drain: dump signal, stop, Preempted. Another
// (SIGINT, SIGHUP, SIGQUIT: a person or a session ended the run) stops the
// workers without the dump and documents Signal<NAME>.
type Terminate struct{ Signal syscall.Signal }

// Tick: a deadline the Policy asked for (Deadline) has come.
type Tick struct{}

func (RoundReady) event()        {}
func (RendezvousFailed) event()  {}
func (WorkerExited) event()      {}
func (Progress) event()          {}
func (MembershipChanged) event() {}
func (Terminate) event()         {}
func (Tick) event()              {}

// Action is an output of the Policy, carried out by the I/O loop in order.
type Action interface{ action() }

// JoinRound: ask the rendezvous for the next round (answer: RoundReady).
// After a stopped group it is a restart: Restart says why ("failure" spends
// the budget, "membership" does not) and RestartCount is the budget spent
// with it; both are zero for the first join.
type JoinRound struct {
	Restart      string
	RestartCount int
}

// Why a group restarts (JoinRound.Restart).
const (
	RestartAfterFailure    = "failure"
	RestartAfterMembership = "membership"
)

// StartGroup: start LocalWorkers workers for Round with these counters.
type StartGroup struct {
	Attempt      int
	RestartCount int
	Round        Round
}

// SignalGroup: send Signal to every live worker's process group.
type SignalGroup struct {
	Attempt int
	Signal  syscall.Signal
}

// WriteDocument: write the pod's error document.
type WriteDocument struct{ Failure kferrors.Failure }

// Exit: the agent is done; exit the process with Code.
type Exit struct{ Code int }

// WatchRound (Command): the master completed Round while the command runs;
// watch it for the next change. Nothing is started or stopped.
type WatchRound struct{ Round Round }

func (JoinRound) action()     {}
func (StartGroup) action()    {}
func (SignalGroup) action()   {}
func (WriteDocument) action() {}
func (Exit) action()          {}
func (WatchRound) action()    {}

// NewPolicy returns a Policy in the rendezvous phase; the loop carries out
// Start's actions first.
func NewPolicy(cfg PolicyConfig) *Policy {
	if cfg.LocalWorkers < 1 || cfg.Command {
		cfg.LocalWorkers = 1
	}
	return &Policy{cfg: cfg}
}

// Start returns the first actions: join the first round.
func (p *Policy) Start() []Action { return []Action{JoinRound{}} }

// Done reports whether the Policy has returned its Exit action.
func (p *Policy) Done() bool { return p.phase == phaseDone }

// RestartCount is the budget spent so far.
func (p *Policy) RestartCount() int { return p.restarts }

// Attempt is the number of the current (or last) group start.
func (p *Policy) Attempt() int { return p.attempt }

// Stopping reports whether the Policy is stopping the group: a worker that
// exits now ends by the stop, or as a secondary failure, not as a cause.
func (p *Policy) Stopping() bool { return p.phase == phaseStopping }

// Deadline is the earliest time the Policy wants a Tick (SIGKILL after the
// stop grace, end of the dump window, a worker's hang deadline); zero if none.
func (p *Policy) Deadline() time.Time {
	var d time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	switch p.phase {
	case phaseRunning:
		if p.cfg.HangTimeout > 0 {
			for i, ok := range p.alive {
				if ok {
					earlier(p.progress[i].Add(p.cfg.HangTimeout))
				}
			}
		}
	case phaseStopping:
		if !p.signaled {
			earlier(p.dumpUntil)
		} else {
			earlier(p.killAt)
		}
	}
	return d
}

// Step feeds one event observed at now and returns the actions to take.
func (p *Policy) Step(ev Event, now time.Time) []Action {
	if p.phase == phaseDone {
		return nil
	}
	switch ev := ev.(type) {
	case RoundReady:
		return p.roundReady(ev, now)
	case RendezvousFailed:
		return p.rendezvousFailed(ev, now)
	case WorkerExited:
		return p.workerExited(ev, now)
	case Progress:
		if ev.Attempt == p.attempt && p.phase == phaseRunning && ev.LocalRank < len(p.progress) && ev.At.After(p.progress[ev.LocalRank]) {
			p.progress[ev.LocalRank] = ev.At
		}
		return nil
	case MembershipChanged:
		if p.phase != phaseRunning || ev.Round != p.round.Number {
			return nil
		}
		if p.cfg.Command {
			if p.rejoining {
				return nil
			}
			p.rejoining = true
			return []Action{JoinRound{}}
		}
		return p.stop(reasonMembership, now)
	case Terminate:
		return p.terminate(ev.Signal, now)
	case Tick:
		return p.tick(now)
	}
	panic(fmt.Sprintf("agent: unknown event %T", ev))
}

// rendezvousFailed ends the pod: at once while it waits for a round, after
// stopping the command when it fails while one runs (Command).
func (p *Policy) rendezvousFailed(ev RendezvousFailed, now time.Time) []Action {
	if ev.Code == kferrors.CodeJobSucceeded && p.phase == phaseRendezvous {
		// Nothing failed: the others finished the training while this
		// node waited for a round. No document, exit 0 (the pod succeeds).
		p.phase = phaseDone
		return []Action{Exit{Code: 0}}
	}
	if ev.Code == kferrors.CodeRendezvousClosed && p.phase == phaseRendezvous && len(p.failures) > 0 {
		// The workers failed and the pod joined again to restart them, but
		// another node's workers succeeded meanwhile: the master closed the
		// rendezvous and no round will come (torch: RendezvousClosedError).
		// The pod ends at once with what failed, its workers' own error.
		acts := p.finish(podRootCause(p.failures))
		if ev.NoRelaunch {
			acts[len(acts)-1] = Exit{Code: 1}
		}
		return acts
	}
	code := ev.Code
	if code == "" {
		code = kferrors.CodeRendezvousTimeout
	}
	f := kferrors.SystemFailure(code, ev.Message, p.cfg.Pod, now)
	f.Recoverable = !ev.Permanent
	switch {
	case p.phase == phaseRendezvous:
		return p.finishExcluded(f, ev.NoRelaunch)
	case p.cfg.Command && p.phase == phaseRunning && p.rejoining:
		p.rejoining = false
		p.excluded, p.exitOne = f, ev.NoRelaunch
		return p.stop(reasonExcluded, now)
	}
	return nil
}

func (p *Policy) roundReady(ev RoundReady, now time.Time) []Action {
	if p.cfg.Command && p.phase == phaseRunning && p.rejoining {
		p.rejoining = false
		p.round = ev.Round
		return []Action{WatchRound{Round: ev.Round}}
	}
	if p.phase != phaseRendezvous {
		return nil
	}
	p.round = ev.Round
	p.attempt++
	p.phase = phaseRunning
	p.reason = reasonNone
	p.signaled = false
	p.killAt, p.dumpUntil = time.Time{}, time.Time{}
	p.failures = p.failures[:0]
	p.alive = make([]bool, p.cfg.LocalWorkers)
	p.progress = make([]time.Time, p.cfg.LocalWorkers)
	for i := range p.alive {
		p.alive[i] = true
		p.progress[i] = now
	}
	return []Action{StartGroup{Attempt: p.attempt, RestartCount: p.restarts, Round: ev.Round}}
}

func (p *Policy) workerExited(ev WorkerExited, now time.Time) []Action {
	if ev.Attempt != p.attempt || ev.LocalRank < 0 || ev.LocalRank >= len(p.alive) || !p.alive[ev.LocalRank] {
		return nil
	}
	p.alive[ev.LocalRank] = false
	e := ev.Exit
	if e.ObservedAt.IsZero() {
		e.ObservedAt = now
	}
	succeeded := ev.StartError == "" && e.ExitCode == 0 && e.Signal == 0 && e.TorchError == nil && !e.OOM
	var failed *kferrors.Failure
	switch {
	case ev.StartError != "":
		f := kferrors.UserError(kferrors.CodeStartFailed, ev.StartError, e.Worker, e.ObservedAt)
		failed = &f
		p.unstartable = p.unstartable || ev.Permanent
	case succeeded:
	case p.phase == phaseStopping && e.TorchError == nil && !e.OOM:
		// Ended by our own stop signal, or a secondary failure that left no
		// error file: not a cause.
	default:
		f := kferrors.Classify(e)
		failed = &f
	}
	// After a stop signal only a failure dated before it is one of the
	// workers' own (an exception raised before the signal, seen after it);
	// the rest is the signal's doing.
	if failed != nil && (p.reason != reasonTerminate || (!failed.Time.IsZero() && failed.Time.Before(p.terminated))) {
		p.failures = append(p.failures, *failed)
	}
	switch p.phase {
	case phaseRunning:
		if failed != nil {
			return p.stop(reasonFailure, now)
		}
		if p.anyAlive() {
			return nil // the others are still training; torchrun waits as well
		}
		p.phase = phaseDone
		return []Action{Exit{Code: 0}}
	case phaseStopping:
		if p.anyAlive() {
			return nil
		}
		return p.stopped(now)
	}
	return nil
}

func (p *Policy) anyAlive() bool { return slices.Contains(p.alive, true) }

// stop begins stopping the running group for reason.
func (p *Policy) stop(reason stopReason, now time.Time) []Action {
	p.phase = phaseStopping
	p.reason = reason
	if !p.anyAlive() {
		return p.stopped(now)
	}
	return p.signalStop(now)
}

func (p *Policy) signalStop(now time.Time) []Action {
	p.signaled = true
	p.killAt = now.Add(p.cfg.StopGrace)
	return []Action{SignalGroup{Attempt: p.attempt, Signal: syscall.SIGTERM}}
}

func (p *Policy) terminate(sig syscall.Signal, now time.Time) []Action {
	if !p.terminated.IsZero() {
		return nil
	}
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	p.terminated, p.stopSig = now, sig
	switch p.phase {
	case phaseRendezvous:
		return p.finishStopped(p.preempted())
	case phaseRunning:
		p.phase = phaseStopping
		p.reason = reasonTerminate
		if !p.anyAlive() {
			return p.stopped(now)
		}
		if sig == syscall.SIGTERM && p.cfg.DumpSignal != 0 && p.cfg.DumpTimeout > 0 {
			p.dumpUntil = now.Add(p.cfg.DumpTimeout)
			return []Action{SignalGroup{Attempt: p.attempt, Signal: p.cfg.DumpSignal}}
		}
		return p.signalStop(now)
	case phaseStopping:
		// Already stopping: finish the stop, then exit instead of restarting.
		p.reason = reasonTerminate
	}
	return nil
}

func (p *Policy) tick(now time.Time) []Action {
	switch p.phase {
	case phaseRunning:
		if p.cfg.HangTimeout <= 0 {
			return nil
		}
		var hung []int
		for i, ok := range p.alive {
			if ok && !now.Before(p.progress[i].Add(p.cfg.HangTimeout)) {
				hung = append(hung, i)
			}
		}
		if len(hung) == 0 {
			return nil
		}
		for _, i := range hung {
			w := workerName(p.cfg.Pod, i)
			msg := fmt.Sprintf("worker %s made no progress (no output, no touch of its progress file) for %s", w, p.cfg.HangTimeout)
			p.failures = append(p.failures, kferrors.SystemFailure(kferrors.CodeHang, msg, w, p.progress[i].Add(p.cfg.HangTimeout)))
		}
		return p.stop(reasonFailure, now)
	case phaseStopping:
		if !p.signaled && !p.dumpUntil.IsZero() && !now.Before(p.dumpUntil) {
			return p.signalStop(now)
		}
		if p.signaled && !p.killAt.IsZero() && !now.Before(p.killAt) {
			p.killAt = time.Time{}
			return []Action{SignalGroup{Attempt: p.attempt, Signal: syscall.SIGKILL}}
		}
	}
	return nil
}

// stopped decides what follows a group whose workers have all ended.
func (p *Policy) stopped(now time.Time) []Action {
	p.killAt, p.dumpUntil = time.Time{}, time.Time{}
	switch p.reason {
	case reasonTerminate:
		return p.finishStopped(p.preempted())
	case reasonMembership:
		p.phase = phaseRendezvous
		return []Action{JoinRound{Restart: RestartAfterMembership, RestartCount: p.restarts}}
	case reasonExcluded:
		return p.finishExcluded(p.excluded, p.exitOne)
	}
	root := podRootCause(p.failures)
	if NodeLevel(root) || p.unstartable || p.restarts >= p.cfg.MaxRestarts || p.cfg.Command {
		return p.finish(root)
	}
	p.restarts++
	p.restartedFrom = root
	p.phase = phaseRendezvous
	return []Action{JoinRound{Restart: RestartAfterFailure, RestartCount: p.restarts}}
}

// preempted is the document of a stop signal: Preempted for SIGTERM,
// Signal<NAME> (exit 128+N, see ExitCode) for the others.
func (p *Policy) preempted() kferrors.Failure {
	if p.stopSig != syscall.SIGTERM {
		name := kferrors.SignalName(p.stopSig)
		return kferrors.SystemFailure(kferrors.SignalCode(p.stopSig),
			fmt.Sprintf("pod %s got %s (interrupted by a person or its session); workers stopped without a dump", p.cfg.Pod, name),
			p.cfg.Pod, p.terminated)
	}
	return kferrors.SystemFailure(kferrors.CodePreempted,
		fmt.Sprintf("pod %s got SIGTERM (preemption, eviction or node drain); workers stopped", p.cfg.Pod),
		p.cfg.Pod, p.terminated)
}

// finishExcluded ends the pod with the master's refusal f (exit 1 with
// noRelaunch). When f is a hardware fault (a node daemon's event on this
// pod: the master took the pod out), the workers' own earlier failure is
// kept too (ownFirst): NCCL's watchdog timing out on the GPU that fell off
// the bus, which the reader shows explained by the fault
// (kferrors.HardwareWindow), also when it ended the group before last,
// restarted in place. Other refusals keep one document: the
// workers' errors are then their consequences.
func (p *Policy) finishExcluded(f kferrors.Failure, noRelaunch bool) []Action {
	acts := p.finish(f)
	if noRelaunch {
		acts[len(acts)-1] = Exit{Code: 1}
	}
	if kferrors.IsHardwareCode(f.Code) {
		// The workers' NCCL timeout can come before the master hears of
		// the fault, and the group is then restarted in place: the new
		// attempt ends by the refusal, its workers with nothing of their
		// own, and the restarted attempt's failure is what they saw.
		if r := p.restartedFrom; len(p.failures) == 0 && !p.cfg.Command && kferrors.IsSecondaryCode(r.Code) &&
			!r.Time.IsZero() && !f.Time.After(r.Time.Add(kferrors.HardwareWindow)) {
			return append([]Action{WriteDocument{Failure: r}}, acts...)
		}
		return p.ownFirst(f, acts)
	}
	return acts
}

// finishStopped ends the pod with its stop signal's document f, keeping
// the workers' own earlier failure too (ownFirst): a group that failed
// and then got SIGTERM (the master deleting the pod it just took out,
// a drain while the group stopped) must not lose what its workers raised.
// The pod's document, its exit code and what the master hears stay f's.
func (p *Policy) finishStopped(f kferrors.Failure) []Action {
	return p.ownFirst(f, p.finish(f))
}

// ownFirst puts before acts the document of the last group's own root
// cause, when its workers failed before f, with another code: it is what
// they saw, and the pod's document f (written last) stays the pod's. Not
// under Command: the command documents its own failure (flytekit), which
// the upload finds and refines.
func (p *Policy) ownFirst(f kferrors.Failure, acts []Action) []Action {
	if len(p.failures) == 0 || p.cfg.Command {
		return acts
	}
	if own := podRootCause(p.failures); own.Code != f.Code && !own.Time.IsZero() && !own.Time.After(f.Time) {
		return append([]Action{WriteDocument{Failure: own}}, acts...)
	}
	return acts
}

func (p *Policy) finish(f kferrors.Failure) []Action {
	p.phase = phaseDone
	return []Action{WriteDocument{Failure: f}, Exit{Code: kferrors.ExitCode(f)}}
}

// RootCause is the earliest failure: by time (sub-second), then by worker
// name, so that a peer's secondary "connection closed" error written a
// second later never wins. A zero time sorts last. failures is not modified.
func RootCause(failures []kferrors.Failure) kferrors.Failure {
	if len(failures) == 0 {
		return kferrors.Failure{}
	}
	best := failures[0]
	for _, f := range failures[1:] {
		if earlier(f, best) {
			best = f
		}
	}
	return best
}

// podRootCause is the cause of one failed group of this pod: an OOM kill
// if the pod had one, else RootCause. The OOM killer's victim is reaped
// late in a pod short of memory (its sibling's "Connection closed by peer"
// was written 4–90 ms before the kill was seen on the one-node cluster), so
// by time alone the sibling's consequence wins, the pod restarts its
// workers into the same kill until its budget is spent, and then fails as
// a user error that the master does not relaunch. The pod's memory is what
// failed: that is what it reports.
func podRootCause(failures []kferrors.Failure) kferrors.Failure {
	var ooms []kferrors.Failure
	for _, f := range failures {
		if f.Code == kferrors.CodeOOMKilled {
			ooms = append(ooms, f)
		}
	}
	if len(ooms) > 0 {
		return RootCause(ooms)
	}
	return RootCause(failures)
}

func earlier(a, b kferrors.Failure) bool {
	switch {
	case a.Time.IsZero() != b.Time.IsZero():
		return b.Time.IsZero()
	case !a.Time.Equal(b.Time):
		return a.Time.Before(b.Time)
	}
	return a.Worker < b.Worker
}

// NodeLevel reports whether a failure cannot be fixed by restarting the
// workers on this node: the pod must go (and the operator relaunch it).
func NodeLevel(f kferrors.Failure) bool {
	switch f.Code {
	case kferrors.CodeOOMKilled, kferrors.CodeNodeCheckFailed, kferrors.CodeStraggler:
		return true
	}
	return false
}

func workerName(pod string, localRank int) string { return fmt.Sprintf("%s/%d", pod, localRank) }
