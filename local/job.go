package local

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

// Job is a local job's bookkeeping as a pure state machine: the pods and
// their slots (the operator's and the scheduler's book), what each pod did
// (steps, rounds, restarts, how it ended), the relaunch decisions carried
// out, the chaos and when it fires, and how long training took to recover
// from each fault. It starts no goroutine, reads no clock and does no I/O:
// every event comes with its time, and Ready returns what the engine must
// do about it (start pods, inject faults, move documents, write lines).
// The Engine is the shell around it; testdata/job/*.txt replays its
// scenarios.
//
// Its events come from three places: the engine's processes (a pod started,
// printed a step or its agent's restart count, ended), the owner of the
// relaunch decisions (the master for an elastic job, tfOwner for a TF job),
// and the master's rounds (master.Options.OnRound).
type Job struct {
	cfg  JobConfig
	book pods
	// status is what each pod did, by name (a TF pod recreated under its
	// name starts a new one).
	status map[string]*podStatus
	// carried are the decisions carried out, by seq (a master restarted
	// carries its decisions again).
	carried map[int64]bool
	// waiting are relaunches decided while their pod still ran: its
	// replacement starts once it ended (Reported).
	waiting map[string]master.Decision
	started time.Time
	fired   []bool
	// later is chaos for a rank whose pod was not running when it fired:
	// its next pod gets it. failing are fail-pod ranks, whose replacements
	// fail too.
	later   map[int][]Chaos
	failing map[int]bool
	// recovered are pods whose replacement trained (joined a round): their
	// failure is recovered from.
	recovered map[string]bool
	// unwritten are documents the engine could not write, kept for the
	// root cause.
	unwritten []kferrors.Failure
	maxStep   int64
	// round is the latest round the master told, at lastRound.
	round     int64
	lastRound time.Time
	faults    []fault
	// stopped is the master's reason when it stopped the job; over that
	// the job's owner declared it done (a TF job's chief succeeded);
	// finished that the engine stopped carrying anything out.
	stopped  string
	over     bool
	finished bool

	ready Ready
}

// JobConfig is what a Job needs of the Options.
type JobConfig struct {
	Job                string
	MinNodes, MaxNodes int
	Slots              int
	// Memory is each pod's limit at first (0: none).
	Memory int64
	// TF makes it a TF PS job: pods named by replica, recreated under
	// their name; no master, so no rounds: a recreated pod trains in its
	// predecessor's place once it started.
	TF    *TF
	Chaos []Chaos
	// OOM raises an OOMKilled pod's memory; Limits names how memory is
	// enforced, for the relaunch line.
	OOM    relaunch.OOM
	Limits string
}

// podStatus is what a pod did, as the view and the result show it.
type podStatus struct {
	step, restartCount, groupWorldSize int64
	// exit is how it ended ("" while it runs).
	exit string
	// cause is what the engine did to it: the failure code it dies of when
	// it dies of that ("" if nothing).
	cause string
}

// fault is one chaos action that fired, and the first training step after
// a round that formed after it (zero: none yet).
type fault struct {
	at, recovered time.Time
}

// NewJob is a job whose pods are all pending.
func NewJob(cfg JobConfig) *Job {
	j := &Job{cfg: cfg, status: map[string]*podStatus{}, carried: map[int64]bool{}, waiting: map[string]master.Decision{},
		fired: make([]bool, len(cfg.Chaos)), later: map[int][]Chaos{}, failing: map[int]bool{}, recovered: map[string]bool{}}
	if cfg.TF != nil {
		j.book = NewTFBook(cfg.Job, *cfg.TF, cfg.Memory)
	} else {
		j.book = NewBook(cfg.Job, cfg.MaxNodes, cfg.Slots, cfg.Memory)
	}
	return j
}

// Ready is what the engine must do after the events since the last Ready,
// in this order: write the notes, start the pods (and tell Started or
// StartFailed), then the rest, which may run beside everything else.
type Ready struct {
	Notes []Note
	// Start are pods to start (Running in the book now).
	Start []Pod
	// Inject is chaos to carry out on a running pod.
	Inject []Injection
	// FailOnJoin are pods to kill (NodeLost) once the master knows them:
	// a fail-pod rank's replacements.
	FailOnJoin []string
	// Supersede are replaced pods' documents to move aside: their
	// replacement trains.
	Supersede []Supersession
	// Reap are pods to kill if they have not ended within the grace.
	Reap []Reap
	// RestartMaster: kill-master fired.
	RestartMaster bool
}

func (r Ready) empty() bool {
	return len(r.Notes) == 0 && len(r.Start) == 0 && len(r.Inject) == 0 && len(r.FailOnJoin) == 0 &&
		len(r.Supersede) == 0 && len(r.Reap) == 0 && !r.RestartMaster
}

// Note is one event line of the view (and the log).
type Note struct {
	Kind, Text string
}

// Injection is one chaos action on one pod.
type Injection struct {
	Chaos Chaos
	Pod   string
}

// Supersession moves the documents of Old dated before Before out of the
// reader's way (kferrors.Supersede): By trains in its place since then.
type Supersession struct {
	Old, By string
	Before  time.Time
}

// Reap kills Pod, with Cause as its failure ("" keeps what it had), unless
// it ends within the grace; Note says why when it is killed.
type Reap struct {
	Pod, Cause, Note string
}

// Ready returns and clears what the engine must do.
func (j *Job) Ready() Ready {
	r := j.ready
	j.ready = Ready{}
	return r
}

func (j *Job) note(kind, format string, args ...any) {
	j.ready.Notes = append(j.ready.Notes, Note{Kind: kind, Text: fmt.Sprintf(format, args...)})
}

// Begin starts the job at now: the first pods start, and the chaos due at
// once fires.
func (j *Job) Begin(now time.Time) {
	j.started = now
	j.schedule()
	j.Tick(now)
}

// Tick fires the chaos whose time (after=…) has come.
func (j *Job) Tick(now time.Time) {
	for i, c := range j.cfg.Chaos {
		if c.Step == 0 && !j.fired[i] && !now.Before(j.started.Add(c.After)) {
			j.fire(i, now)
		}
	}
}

// Deadline is when Tick has chaos to fire next (zero: none).
func (j *Job) Deadline() time.Time {
	var next time.Time
	for i, c := range j.cfg.Chaos {
		if at := j.started.Add(c.After); c.Step == 0 && !j.fired[i] && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

// schedule starts the pods that have a slot.
func (j *Job) schedule() {
	if j.finished || j.stopped != "" {
		return
	}
	for _, p := range j.book.Schedule() {
		j.ready.Start = append(j.ready.Start, *p)
	}
}

// Started records that a pod's agent runs (pid), and gives it the chaos
// that waited for its rank.
func (j *Job) Started(name string, pid int, now time.Time) {
	p := j.book.Pod(name)
	if p == nil {
		return
	}
	j.status[name] = &podStatus{}
	mem := ""
	if p.Memory > 0 {
		mem = ", memory " + bytesText(p.Memory)
	}
	j.note("pod", "%s started: rank %d, pid %d%s", name, p.Rank, pid, mem)
	if j.failing[p.Rank] {
		j.ready.FailOnJoin = append(j.ready.FailOnJoin, name)
	}
	j.deliver(*p, false)
	if j.cfg.TF != nil {
		// A TF replica has no rounds (TF_CONFIG fixes its cluster): once
		// recreated and started, it is back in its place.
		j.trains(*p, 1, now)
	}
}

// StartFailed records that a pod's agent could not be started: its slot is
// free again.
func (j *Job) StartFailed(name string, err error) {
	j.note("pod", "%s cannot start: %v", name, err)
	j.book.Exited(name)
}

// NotStarted records a pod the engine did not start because the job is
// stopping: it ends without a process (the engine says so once for all).
func (j *Job) NotStarted(name string) { j.book.Exited(name) }

// Step records a training step a pod printed: the first after a round
// that formed after a fault is that fault's recovery; a new highest step
// fires the chaos waiting for it.
func (j *Job) Step(name string, n int64, now time.Time) {
	if st := j.status[name]; st != nil {
		st.step = n
	}
	for i, f := range j.faults {
		if f.recovered.IsZero() && j.lastRound.After(f.at) {
			j.faults[i].recovered = now
		}
	}
	if n <= j.maxStep {
		return
	}
	j.maxStep = n
	for i, c := range j.cfg.Chaos {
		if c.Step > 0 && c.Step <= n && !j.fired[i] {
			j.fire(i, now)
		}
	}
}

// Restarts records a pod's restart count, as its agent printed it in
// torchrun's rendezvous block.
func (j *Job) Restarts(name string, n int64) {
	st := j.status[name]
	if st == nil || n == st.restartCount {
		return
	}
	if n > st.restartCount {
		j.note("restart", "%s: its agent restarted its workers (restart_count=%d)", name, n)
	}
	st.restartCount = n
}

// Round records a round the master completed: its members train in it;
// a replacement's first recovers the pod it replaces.
func (j *Job) Round(r master.CompletedRound) {
	if r.Number <= j.round {
		return // told again
	}
	j.round = r.Number
	j.note("round", "round %d: group_world_size=%d world_size=%d (%s)", r.Number, len(r.Pods), r.WorldSize, strings.Join(r.Pods, ", "))
	for _, name := range r.Pods {
		if p := j.book.Pod(name); p != nil {
			j.trains(*p, int64(len(r.Pods)), r.At)
		}
	}
}

// trains records that p trains in a group of size from at.
func (j *Job) trains(p Pod, size int64, at time.Time) {
	if st := j.status[p.Name]; st != nil {
		st.groupWorldSize = size
	}
	if at.After(j.lastRound) {
		j.lastRound = at
	}
	if old := p.Replaces; old != "" && !j.recovered[old] {
		j.recovered[old] = true
		j.ready.Supersede = append(j.ready.Supersede, Supersession{Old: old, By: p.Name, Before: at})
	}
	j.deliver(p, true)
}

// deliver gives p the chaos that waited for its rank: once it started, the
// actions that act on any running pod; once it trains (member), also
// those that need it to be in the job (needsMember).
func (j *Job) deliver(p Pod, member bool) {
	var keep []Chaos
	for _, c := range j.later[p.Rank] {
		if needsMember(c.Action) && !member {
			keep = append(keep, c)
			continue
		}
		j.inject(c, p.Name, p.Rank)
	}
	if len(keep) == 0 {
		delete(j.later, p.Rank)
	} else {
		j.later[p.Rank] = keep
	}
}

// needsMember: the action must wait until its pod has joined a round.
// Deleted, cut off or killed before the master knew it, a pod is replaced
// by nobody (the master relaunches only ranks it knows), and the job waited
// ≈10 minutes for the master's timeouts; a worker to kill or drive out of
// memory does not exist before the round.
func needsMember(a Action) bool {
	switch a {
	case DeletePod, KillWorker, CutNetwork, OOM:
		return true
	}
	return false
}

// member reports whether the pod trains: it was in a completed round (a
// TF replica once started).
func (j *Job) member(name string) bool {
	st := j.status[name]
	return st != nil && st.groupWorldSize > 0
}

// Carry carries out a relaunch decision as the training operator would: a
// relaunch gets a new pod for the rank (twice the memory after an OOM
// kill), once the old one ended; a stop drops the pods not started.
// Decisions carried again are recognised by their seq.
func (j *Job) Carry(d master.Decision, now time.Time) {
	if j.carried[d.Seq] || j.finished {
		return
	}
	j.carried[d.Seq] = true
	switch d.Kind {
	case master.StopJob:
		j.stopped = d.Message
		for _, p := range j.book.Pods() {
			if p.State == Pending {
				j.book.Drop(p.Name)
			}
		}
		j.note("master", "the master stopped the job: %s", d.Message)
	case relaunch.None:
		j.note("master", "%s (rank %d) is not relaunched after %s", d.Pod, d.Rank, kferrors.Headline(d.Reason, kferrors.OneLine(d.Message)))
	default:
		if p := j.book.Pod(d.Pod); p != nil && p.State == Running {
			// Its agent has not exited yet (it is leaving, or it is lost):
			// the replacement starts once it is gone.
			j.waiting[d.Pod] = d
			j.ready.Reap = append(j.ready.Reap, Reap{Pod: d.Pod,
				Note: fmt.Sprintf("%s still runs after the master's %s decision; killing it", d.Pod, master.KindName(d.Kind))})
			return
		}
		j.relaunch(d)
	}
}

func (j *Job) relaunch(d master.Decision) {
	old := j.book.Current(d.Rank)
	mem := int64(0)
	if old != nil {
		mem = old.Memory
	}
	note := ""
	if d.Kind == relaunch.MoreMemory {
		if next, ok := j.cfg.OOM.Raised(mem); ok {
			note = fmt.Sprintf(", memory %s → %s (%s)", bytesText(mem), bytesText(next), j.cfg.Limits)
			mem = next
		}
	}
	p := j.book.Relaunch(d.Rank, mem)
	counted := "not counted"
	if d.Counted {
		counted = "counted"
	}
	j.note("relaunch", "%s replaces %s as rank %d after %s (%s, %s%s)", p.Name, d.Pod, d.Rank, d.Reason, master.KindName(d.Kind), counted, note)
	j.schedule()
}

// fire carries out chaos spec i once: on the job (add-slot, kill-master)
// or on the pod that holds its rank now (a pod not running yet gets it
// when it starts).
func (j *Job) fire(i int, now time.Time) {
	if j.fired[i] || j.finished {
		return
	}
	j.fired[i] = true
	j.faults = append(j.faults, fault{at: now})
	c := j.cfg.Chaos[i]
	switch c.Action {
	case AddSlot:
		j.book.AddSlot()
		j.note("chaos", "add-slot: %d slots", j.book.Slots())
		j.schedule()
		return
	case KillMaster:
		j.ready.RestartMaster = true
		return
	}
	cur := j.book.Current(c.Node)
	running := cur != nil && cur.State == Running
	if running && (!needsMember(c.Action) || j.member(cur.Name)) {
		j.inject(c, cur.Name, c.Node)
		return
	}
	j.later[c.Node] = append(j.later[c.Node], c)
	if running {
		j.note("chaos", "%s: %s has not joined a round yet; it fires once it has", c, cur.Name)
		return
	}
	when := ""
	if needsMember(c.Action) {
		when = " once it has joined a round"
	}
	j.note("chaos", "%s: rank %d has no running pod; it applies to the next one%s", c, c.Node, when)
}

func (j *Job) inject(c Chaos, pod string, rank int) {
	if c.Action == FailPod {
		j.failing[rank] = true
	}
	j.ready.Inject = append(j.ready.Inject, Injection{Chaos: c, Pod: pod})
}

// Caused records what the engine did to a pod: the failure it dies of if
// it dies of it ("" keeps what it had).
func (j *Job) Caused(name, code string) {
	if st := j.status[name]; st != nil && code != "" {
		st.cause = code
	}
}

// PodEnd is how a pod's agent process ended, as the engine saw it.
type PodEnd struct {
	// Succeeded: it exited 0.
	Succeeded bool
	// OOMKilled: the kernel OOM-killed a process of its memory cgroup.
	OOMKilled bool
	// Signal killed it (0: it exited, with ExitStatus).
	Signal     syscall.Signal
	ExitStatus int
}

// Ending is what Exited made of a pod's end.
type Ending struct {
	// Exit is how the view shows it: "succeeded", "exit 1", a failure code,
	// "cleaned up".
	Exit string
	// Succeeded: its agent exited 0. CleanedUp: the engine stopped it
	// because the job was over.
	Succeeded, CleanedUp bool
	// Document is the failure the engine writes for the pod, whose agent
	// died with it (what the plugin synthesizes from a pod's status on
	// Kubernetes); nil when its agent wrote its own or it did not fail.
	Document *kferrors.Failure
}

// causeCleanup is the cause of a pod stopped because the job is over.
const causeCleanup = "Cleanup"

// Exited records that a pod's agent process ended, and frees its slot. The
// engine then writes the Ending's Document, tells the owner, and calls
// Reported.
func (j *Job) Exited(name string, end PodEnd, now time.Time) Ending {
	j.book.Exited(name)
	st := j.status[name]
	if st == nil {
		st = &podStatus{}
		j.status[name] = st
	}
	mem := int64(0)
	if p := j.book.Pod(name); p != nil {
		mem = p.Memory
	}
	var e Ending
	switch {
	case end.Succeeded:
		e.Exit, e.Succeeded = "succeeded", true
	case st.cause == causeCleanup:
		e.Exit, e.CleanedUp = "cleaned up", true
	case end.OOMKilled || st.cause == kferrors.CodeOOMKilled:
		e.Document = failure(kferrors.CodeOOMKilled, fmt.Sprintf("pod %s was OOMKilled: it went past its memory limit of %s", name, bytesText(mem)), name, now)
	case st.cause == kferrors.CodeNodeLost:
		e.Document = failure(kferrors.CodeNodeLost, fmt.Sprintf("pod %s failed: its machine is gone", name), name, now)
	case end.Signal != 0:
		code := kferrors.SignalCode(end.Signal)
		if st.cause == kferrors.CodePreempted {
			code = kferrors.CodePreempted
		}
		e.Document = failure(code, fmt.Sprintf("pod %s was killed by %s", name, kferrors.SignalName(end.Signal)), name, now)
	default:
		e.Exit = exitText(end.ExitStatus)
	}
	if e.Document != nil {
		e.Exit = e.Document.Code
	}
	st.exit = e.Exit
	return e
}

func failure(code, message, pod string, now time.Time) *kferrors.Failure {
	f := kferrors.SystemFailure(code, message, pod, now)
	return &f
}

// Reported records that a pod's end is written and told: a relaunch that
// waited for it starts now.
func (j *Job) Reported(name string) {
	if st := j.status[name]; st != nil {
		j.note("pod", "%s exited: %s", name, st.exit)
	}
	if d, ok := j.waiting[name]; ok {
		delete(j.waiting, name)
		j.relaunch(d)
	}
	j.schedule()
}

// Unwritten keeps a document the engine could not write, for the root
// cause.
func (j *Job) Unwritten(f kferrors.Failure) { j.unwritten = append(j.unwritten, f) }

// Over records that the job's owner declared it done (a TF job's chief
// succeeded): the pods still running get the grace to end by themselves,
// then are stopped.
func (j *Job) Over(why string) {
	j.over = true
	j.note("job", "%s", why)
	for _, p := range j.book.Pods() {
		if p.State == Running {
			j.ready.Reap = append(j.ready.Reap, Reap{Pod: p.Name, Cause: causeCleanup,
				Note: fmt.Sprintf("%s still runs after the job is done: deleting it", p.Name)})
		}
	}
}

// Finish stops the bookkeeping: nothing more is started, carried out or
// fired.
func (j *Job) Finish() { j.finished = true }

// Finished reports whether Finish was called.
func (j *Job) Finished() bool { return j.finished }

// Done reports whether the job is over: no pod pending or running, and no
// relaunch waiting.
func (j *Job) Done() bool { return j.book.Done() && len(j.waiting) == 0 }

// LatestRound is the latest round the master told.
func (j *Job) LatestRound() int64 { return j.round }

// MaxStep is the highest step any pod printed.
func (j *Job) MaxStep() int64 { return j.maxStep }

// rows is the view's table: every pod, what it did.
func (j *Job) rows() []row {
	var out []row
	for _, p := range j.book.Pods() {
		r := row{pod: p.Name, state: string(p.State), rank: p.Rank}
		if st := j.status[p.Name]; st != nil {
			r.restarts, r.groupWorldSize, r.lastStep, r.exit = st.restartCount, st.groupWorldSize, st.step, st.exit
		}
		out = append(out, r)
	}
	return out
}

// Outcome is the job's end as the bookkeeping has it.
type Outcome struct {
	// Succeeded: the owner declared the job done, or the master did not
	// stop it and at least MinNodes ranks' last pods finished training.
	Succeeded bool
	Stopped   string
	Pods      []Pod
	// Recovery is, for each fault, the time to the first step after a
	// round formed again (zero: training did not resume after it).
	Recovery []time.Duration
	// Unwritten are the documents the engine could not write, of pods not
	// recovered from.
	Unwritten []kferrors.Failure
}

// Outcome is how the job ended.
func (j *Job) Outcome() Outcome {
	o := Outcome{Stopped: j.stopped, Pods: j.book.Pods()}
	for _, f := range j.faults {
		var d time.Duration
		if !f.recovered.IsZero() {
			d = f.recovered.Sub(f.at)
		}
		o.Recovery = append(o.Recovery, d)
	}
	for _, f := range j.unwritten {
		if !j.recovered[f.Worker] {
			o.Unwritten = append(o.Unwritten, f)
		}
	}
	var finished []int
	for _, p := range o.Pods {
		if st := j.status[p.Name]; st != nil && st.exit == "succeeded" && !slices.Contains(finished, p.Rank) {
			finished = append(finished, p.Rank)
		}
	}
	o.Succeeded = j.over || j.stopped == "" && len(finished) >= j.cfg.MinNodes
	return o
}

// exitText names an agent's exit status as the exit-code contract reads
// it back (kferrors.CodeOfExit): exit 200 (NodeCheckFailed), exit 143
// (Preempted), exit 139 (SignalSIGSEGV); a plain exit 1 stays bare.
func exitText(code int) string {
	name := kferrors.CodeOfExit(code)
	if name == "" || name == kferrors.CodeNonZeroExit {
		return fmt.Sprintf("exit %d", code)
	}
	return fmt.Sprintf("exit %d (%s)", code, name)
}

func bytesText(b int64) string {
	switch {
	case b <= 0:
		return "none"
	case b >= 1<<30:
		return strconv.FormatFloat(float64(b)/(1<<30), 'f', -1, 64) + " GiB"
	}
	return strconv.FormatFloat(float64(b)/(1<<20), 'f', -1, 64) + " MiB"
}
