package master

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

// Config is the job's rendezvous and policies (docs/DESIGN.md §5.2–§5.5).
type Config struct {
	// JobID is the job's rendezvous id (--rdzv-id); the state under --state
	// belongs to it.
	JobID string
	// MinNodes and MaxNodes bound the rounds; NodeUnit (≥ 1) makes their size
	// a multiple of it.
	MinNodes, MaxNodes, NodeUnit int
	// WaitingTimeout is the last call: a round with at least MinNodes (and
	// fewer than MaxNodes) completes once this passed since the last join.
	WaitingTimeout time.Duration
	// ExpectedNodes (0: unknown) is how many nodes the job was created with,
	// its Worker replicas on Kubernetes: once that many wait, and no node
	// still runs an older round (it is coming), nobody else is coming
	// (short of someone scaling the job, which a later round absorbs), and
	// the last call would only delay the start.
	ExpectedNodes int
	// JoinTimeout: a node that waited this long without a round exits with
	// RendezvousTimeout.
	JoinTimeout time.Duration
	// PendTimeout: when fewer than MinNodes wait for this long, the job stops.
	PendTimeout time.Duration
	// HeartbeatTimeout: a node silent this long is dead (its rank leaves).
	HeartbeatTimeout time.Duration
	// NetworkCheck runs the 2-round node health check before a round with a
	// node that has not passed it; ExcludeStraggler also excludes nodes slower
	// than StragglerFactor × the median (otherwise they are only reported).
	NetworkCheck     bool
	ExcludeStraggler bool
	// CheckTimeout bounds one check round; a node without a report by then
	// failed it.
	CheckTimeout time.Duration
	// Relaunch is the relaunch policy.
	Relaunch relaunch.Policy
}

// Defaults of Config. The heartbeat is tighter than DLRover's (15 s, dead
// after 600 s): a lost pod is noticed in HeartbeatTimeout, and with a
// replacement pod ready in seconds that is most of the recovery time. The
// cost is HeartbeatInterval's traffic: one small call per node per interval
// (2,000 calls/s for 10,000 nodes at 5 s), which the master answers from
// memory without writing anything.
const (
	DefaultWaitingTimeout    = 30 * time.Second
	DefaultJoinTimeout       = 600 * time.Second
	DefaultPendTimeout       = 600 * time.Second
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultHeartbeatTimeout  = 30 * time.Second
	DefaultCheckTimeout      = 120 * time.Second
	// StragglerFactor: a node whose check took more than this times the
	// median is a straggler (DLRover's rule).
	StragglerFactor = 2
)

// Limits on what one request may carry.
const (
	MaxPodName      = 253 // a Kubernetes object name
	MaxIncarnation  = 128
	MaxAddr         = 255
	MaxLocalWorkers = 4096
)

func (c *Config) setDefaults() error {
	if c.NodeUnit < 1 {
		c.NodeUnit = 1
	}
	if c.MinNodes < 1 || c.MaxNodes < c.MinNodes {
		return fmt.Errorf("nnodes %d:%d: want 1 ≤ MIN ≤ MAX", c.MinNodes, c.MaxNodes)
	}
	if c.MaxNodes > 1<<20 {
		return fmt.Errorf("nnodes %d:%d: at most %d nodes", c.MinNodes, c.MaxNodes, 1<<20)
	}
	if c.MinNodes%c.NodeUnit != 0 && c.MinNodes < c.NodeUnit {
		return fmt.Errorf("node unit %d is larger than min nodes %d", c.NodeUnit, c.MinNodes)
	}
	if c.ExpectedNodes != 0 && (c.ExpectedNodes < c.MinNodes || c.ExpectedNodes > c.MaxNodes) {
		return fmt.Errorf("expected nodes %d outside nnodes %d:%d", c.ExpectedNodes, c.MinNodes, c.MaxNodes)
	}
	for _, d := range []*time.Duration{&c.WaitingTimeout, &c.JoinTimeout, &c.PendTimeout, &c.HeartbeatTimeout, &c.CheckTimeout} {
		if *d < 0 {
			return fmt.Errorf("negative timeout %s", *d)
		}
	}
	if c.WaitingTimeout == 0 {
		c.WaitingTimeout = DefaultWaitingTimeout
	}
	if c.JoinTimeout == 0 {
		c.JoinTimeout = DefaultJoinTimeout
	}
	if c.PendTimeout == 0 {
		c.PendTimeout = DefaultPendTimeout
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.CheckTimeout == 0 {
		c.CheckTimeout = DefaultCheckTimeout
	}
	if c.Relaunch == (relaunch.Policy{}) {
		c.Relaunch = relaunch.DefaultPolicy
	}
	return nil
}

// NodeState is where a rank's current pod stands.
type NodeState string

const (
	// Joining: waiting for the next round (or for its health check).
	Joining NodeState = "joining"
	// Running: a member of the latest round, training.
	Running NodeState = "running"
	// Succeeded: its agent left with its workers done; or it waited for a
	// round when another node's workers succeeded, and was told the job is
	// done (its Exclusion is JobSucceeded).
	Succeeded NodeState = "succeeded"
	// Failed: its agent left with a failure, was excluded, or went silent.
	Failed NodeState = "failed"
)

func (s NodeState) alive() bool { return s == Joining || s == Running }

// NodeInfo is what a node says of itself when it calls.
type NodeInfo struct {
	Pod            string
	Incarnation    string
	Rank           int // -1: the master chooses
	LocalWorldSize int
	Addr           string
	Port           int
	Host           string
}

// Node is the master's record of one rank: its current pod and history.
type Node struct {
	NodeInfo
	State NodeState
	// Round is the latest round the rank's pod was a member of.
	Round int64
	// AfterRound is, while Joining, the round the pod wants one after.
	AfterRound int64
	// JoinedAt is when the pod started waiting; LastSeen its latest call,
	// moved later by any time since in which the master could not answer
	// (Stalled).
	JoinedAt, LastSeen time.Time
	// LastCall is the time of its latest call to this master process;
	// zero for a node restored from the state that has not called since
	// (LastSeen is then the restart, its grace).
	LastCall time.Time
	// Checked: this pod passed the node health check.
	Checked bool
	// Relaunches is the rank's counted relaunches (across pods).
	Relaunches int
	// Relaunching: a relaunch was decided and its pod has not joined yet.
	Relaunching bool
	// Exclusion, when set, is the answer to the pod's every call: it must
	// exit with this document.
	Exclusion *Exclusion
	// Step is the last training step the pod reported.
	Step int64
}

// Exclusion tells a node to exit: its error document's code and message,
// and whether the master wants its pod back (Relaunch: the agent exits with
// a retryable code) or not (it exits 1).
type Exclusion struct {
	Code     string
	Message  string
	Relaunch bool
}

// Round is a completed rendezvous round: its members by group rank.
type Round struct {
	Number          int64
	Ranks           []int
	LocalWorldSizes []int
	MasterAddr      string
	MasterPort      int
	CompletedAt     time.Time
	// Departed is how many members of the round before are not members of
	// this one (by pod and incarnation: a replaced or restarted pod's
	// torch is a new one); 0 also when the round before is not known by
	// its pods (a master restarted since: pods are not part of its state).
	Departed int
	// DepartedKnown: Departed is a count of this master's, 0 meaning every
	// member of the round before is in this one (a scale-up).
	DepartedKnown bool
	// DepartedSince is the earliest failure time the departed members
	// reported (a preemption's: its SIGTERM), zero when none did.
	DepartedSince time.Time

	pods  []string    // group rank → pod/incarnation, at completion (not durable)
	index map[int]int // rank → group rank
	first []int       // group rank → first global rank
	world int
}

func (r *Round) build() {
	r.index = make(map[int]int, len(r.Ranks))
	r.first = make([]int, len(r.Ranks))
	r.world = 0
	for i, rank := range r.Ranks {
		r.index[rank] = i
		r.first[i] = r.world
		r.world += r.LocalWorldSizes[i]
	}
}

// CompletedRound is a round as Options.OnRound tells it.
type CompletedRound struct {
	Number int64
	// Pods are its members' pods, by group rank (GroupWorldSize is their
	// number); WorldSize counts their workers.
	Pods      []string
	WorldSize int
	// At is when the master completed it.
	At time.Time
}

// completed is r as OnRound tells it (a round completed by this master:
// its pods are known).
func (r *Round) completed() CompletedRound {
	c := CompletedRound{Number: r.Number, WorldSize: r.world, At: r.CompletedAt}
	for _, p := range r.pods {
		pod, _, _ := strings.Cut(p, "/") // pod/incarnation; a pod's name has no "/"
		c.Pods = append(c.Pods, pod)
	}
	return c
}

// Assignment is one member's view of a round.
type Assignment struct {
	Number          int64
	GroupRank       int
	GroupWorldSize  int
	WorldSize       int
	FirstGlobalRank int
	LocalWorldSize  int
	MasterAddr      string
	MasterPort      int
	// Departed is the round's: members of the round before that are gone
	// (DepartedKnown: a count, not "unknown"); DepartedSince the earliest
	// failure time they reported.
	Departed      int
	DepartedKnown bool
	DepartedSince time.Time
}

func (r *Round) assignment(rank int) (Assignment, bool) {
	g, ok := r.index[rank]
	if !ok {
		return Assignment{}, false
	}
	return Assignment{Number: r.Number, GroupRank: g, GroupWorldSize: len(r.Ranks), WorldSize: r.world,
		FirstGlobalRank: r.first[g], LocalWorldSize: r.LocalWorldSizes[g], MasterAddr: r.MasterAddr, MasterPort: r.MasterPort,
		Departed: r.Departed, DepartedKnown: r.DepartedKnown, DepartedSince: r.DepartedSince}, true
}

// JoinAnswer is the answer to a Join: exactly one of Round, Check, Excluded,
// or none of them (pending: ask again).
type JoinAnswer struct {
	Rank     int
	Round    *Assignment
	Check    *CheckTask
	Excluded *Exclusion
	// Waiting is how many nodes wait for the next round (while pending).
	Waiting int
}

// Pending reports whether the answer is "not yet".
func (a JoinAnswer) Pending() bool { return a.Round == nil && a.Check == nil && a.Excluded == nil }

// HeartbeatAction is what a heartbeat's reply tells the node to do.
type HeartbeatAction int

const (
	// Continue: nothing to do.
	Continue HeartbeatAction = iota
	// Restart: the node's round is outdated; join the next one (free).
	Restart
	// Exit: exit with the answer's Exclusion.
	Exit
)

func (a HeartbeatAction) String() string {
	return [...]string{"continue", "restart", "exit"}[a]
}

// HeartbeatAnswer is the reply to a heartbeat.
type HeartbeatAnswer struct {
	Action      HeartbeatAction
	Exit        *Exclusion
	LatestRound int64
}

// DecisionKind is a relaunch decision's kind, or StopJob.
type DecisionKind = relaunch.Kind

// StopJob is the decision that the job cannot go on.
const StopJob relaunch.Kind = 100

// Decision is one relaunch decision, data for whoever owns pods (the
// Kubernetes owner, the local engine): carried out there, logged and
// counted here.
type Decision struct {
	Seq     int64
	Kind    relaunch.Kind
	Rank    int
	Pod     string
	Host    string
	Reason  string // the failure code
	Message string
	Counted bool
	Time    time.Time
}

func (d Decision) String() string {
	if d.Kind == StopJob {
		return fmt.Sprintf("decision %d: stop the job: %s", d.Seq, d.Message)
	}
	return fmt.Sprintf("decision %d: rank %d (pod %s): %s after %s", d.Seq, d.Rank, d.Pod, d.Kind, d.Reason)
}

// KindName names a decision kind, StopJob included.
func KindName(k relaunch.Kind) string {
	if k == StopJob {
		return "stop-job"
	}
	return k.String()
}

// Errors of requests, classified by the server into gRPC codes.
var (
	ErrInvalid    = errors.New("invalid request")
	ErrRankHeld   = errors.New("rank held by another pod")
	ErrUnknown    = errors.New("unknown node")
	ErrJobStopped = errors.New("job stopped")
)

// Job is the master's pure state machine for one elastic job: rendezvous
// rounds, the node health check, heartbeats and the relaunch policy. It
// starts no goroutine and reads no clock: every call takes now. Calls
// mutate; Ready returns what the I/O loop must do about it (wake waiters,
// persist records, carry out decisions, log). testdata/*.txt replays its
// scenarios.
type Job struct {
	cfg Config

	nodes map[int]*Node
	byPod map[string]int // pod name → rank it last held
	// claims are replacement pods waiting for a rank that a live pod still
	// holds, by rank (claim).
	claims map[int]*claim
	// fenced are, by rank, the pod incarnations ("pod/incarnation") that
	// held it and were replaced, newest last (at most maxFenced): one
	// calling again is told to exit, never given the rank back, so that two
	// live containers under one pod name cannot take it from each other
	// without end. Kept in the rank's node record: a restarted master
	// still fences them (TestSim, sim_37.txt).
	fenced map[int][]string
	latest *Round
	// lastJoin is the time of the latest join into the waiting set; the
	// last call runs from it.
	lastJoin time.Time
	// belowMinSince is when nodes started waiting with fewer than MinNodes.
	belowMinSince time.Time

	check       *check
	checkRounds int64 // check rounds so far, for DLRover's "Round N" lines

	// Counters kept by count() so that no call is linear in the nodes
	// (10,000 of them join one round): waiting for a round; running; failed
	// and being relaunched; the latest round's members still running it,
	// and those that left it otherwise than by succeeding.
	nWaiting, nRunning, nRelaunching int
	// nSucceeded counts the nodes whose workers succeeded: from the first,
	// the rendezvous is closed (torch's agent closes it when it succeeds).
	nSucceeded              int
	latestAlive, latestDown int
	// outdated caches roundOutdated, so that heartbeat waiters are woken
	// when it turns true, not on every change.
	outdated bool
	// lastSweep is the last Tick's time; heartbeat and join timeouts are
	// swept at most every sweepEvery.
	lastSweep time.Time

	// failedAt is the failure time each pod of the latest round reported
	// (pod/incarnation → time), for the next round's DepartedSince.
	failedAt map[string]time.Time
	// notReady is, by pod/incarnation, the node the Kubernetes node
	// controller said was not ready under that pod (NodeNotReady); not
	// durable: a restarted master's owner lists the events again.
	notReady map[string]NodeNotReady

	decisions   []Decision
	decisionSeq int64
	stopped     bool
	stopReason  string

	ready Ready
}

// NewJob returns the state machine of a job with no nodes yet.
func NewJob(cfg Config) (*Job, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Job{cfg: cfg, nodes: map[int]*Node{}, byPod: map[string]int{}, claims: map[int]*claim{}, fenced: map[int][]string{}}, nil
}

// Config is the job's configuration, defaults filled in.
func (j *Job) Config() Config { return j.cfg }

// Ready is what the I/O loop must do after calls: wake the waiters of
// these ranks (Join and Heartbeat), every heartbeat waiter
// (WakeHeartbeats), or every waiter (WakeAll); persist the dirty records;
// hand out decisions; write the log lines. Taking it clears it.
type Ready struct {
	Wake           map[int]bool
	WakeHeartbeats bool
	WakeAll        bool
	Dirty          Dirty
	Decided        []Decision
	Log            []LogLine
	Rounds         []int64 // rounds completed
	Dead           []int   // ranks declared dead
}

// Dirty names the records changed since the last Ready.
type Dirty struct {
	Nodes     map[int]bool
	Round     bool
	Job       bool
	Decisions []Decision
	// Claims are the ranks whose claim began, changed or ended.
	Claims map[int]bool
}

// Empty reports whether nothing needs persisting.
func (d Dirty) Empty() bool {
	return len(d.Nodes) == 0 && !d.Round && !d.Job && len(d.Decisions) == 0 && len(d.Claims) == 0
}

// LogLine is a structured log line the loop writes.
type LogLine struct {
	Level string // "info", "warn"
	Msg   string
	Attrs []any
}

// Ready returns and clears what happened since the last call.
func (j *Job) Ready() Ready {
	r := j.ready
	j.ready = Ready{}
	return r
}

func (j *Job) wake(rank int) {
	if j.ready.Wake == nil {
		j.ready.Wake = map[int]bool{}
	}
	j.ready.Wake[rank] = true
}

func (j *Job) dirtyNode(rank int) {
	if j.ready.Dirty.Nodes == nil {
		j.ready.Dirty.Nodes = map[int]bool{}
	}
	j.ready.Dirty.Nodes[rank] = true
}

func (j *Job) dirtyClaim(rank int) {
	if j.ready.Dirty.Claims == nil {
		j.ready.Dirty.Claims = map[int]bool{}
	}
	j.ready.Dirty.Claims[rank] = true
}

func (j *Job) logf(level, msg string, attrs ...any) {
	j.ready.Log = append(j.ready.Log, LogLine{Level: level, Msg: msg, Attrs: attrs})
}

// Stopped reports whether the job was stopped, and why.
func (j *Job) Stopped() (bool, string) { return j.stopped, j.stopReason }

// StoppedAndLeft reports whether the job was stopped and none of its nodes
// still runs or joins: nothing will happen in it any more. It returns the
// stop's decision (its time and reason). A master that owns pods on
// Kubernetes then ends, as on success, so that the training operator ends
// the job too: its pods' exit codes say nothing when a command like
// flytekit's exits 0 after writing its error document.
func (j *Job) StoppedAndLeft() (Decision, bool) {
	if !j.stopped {
		return Decision{}, false
	}
	for _, rec := range j.nodes {
		if rec.State.alive() {
			return Decision{}, false
		}
	}
	for i := len(j.decisions) - 1; i >= 0; i-- {
		if j.decisions[i].Kind == StopJob {
			return j.decisions[i], true
		}
	}
	return Decision{Kind: StopJob, Rank: -1, Reason: kferrors.CodeJobStopped, Message: j.stopReason}, true
}

// Latest is the latest completed round, nil before the first.
func (j *Job) Latest() *Round { return j.latest }

// Succeeded reports whether the job is done: every member of the latest
// round succeeded (its agent left with its workers done) and none still
// runs. A master that owns pods on Kubernetes then ends, so that its
// replica completes and the training operator marks the job Succeeded.
func (j *Job) Succeeded() bool {
	if j.latest == nil || j.nSucceeded == 0 || j.stopped {
		return false
	}
	for _, r := range j.latest.Ranks {
		if rec, ok := j.nodes[r]; !ok || rec.State != Succeeded {
			return false
		}
	}
	return true
}

// Nodes returns the ranks' records in rank order (copies).
func (j *Job) Nodes() []Node {
	out := make([]Node, 0, len(j.nodes))
	for _, n := range j.sortedNodes() {
		out = append(out, n.copy())
	}
	return out
}

func (n *Node) copy() Node {
	c := *n
	if n.Exclusion != nil {
		e := *n.Exclusion
		c.Exclusion = &e
	}
	return c
}

// Node returns rank's record.
func (j *Job) Node(rank int) (Node, bool) {
	n, ok := j.nodes[rank]
	if !ok {
		return Node{}, false
	}
	return n.copy(), true
}

// Decisions are the decisions so far, oldest first.
func (j *Job) Decisions() []Decision { return slices.Clone(j.decisions) }

// ---- counters ----

// count adds (sign 1) or removes (sign -1) a record's share of the counters;
// every change of State, Round, Exclusion or Relaunching goes through
// update, which calls it around the change.
func (j *Job) count(rec *Node, sign int) {
	waiting := rec.State == Joining && rec.Exclusion == nil
	if waiting {
		j.nWaiting += sign
	}
	if rec.State == Running {
		j.nRunning += sign
	}
	if rec.State == Succeeded {
		j.nSucceeded += sign
	}
	if rec.State == Failed && rec.Relaunching {
		j.nRelaunching += sign
	}
	if j.latest != nil {
		if _, member := j.latest.index[rec.Rank]; member {
			switch {
			case rec.State == Running && rec.Round == j.latest.Number && rec.Exclusion == nil:
				j.latestAlive += sign
			case rec.State != Succeeded:
				j.latestDown += sign
			}
		}
	}
}

// update changes a record through change, keeping the counters.
func (j *Job) update(rec *Node, change func(*Node)) {
	j.count(rec, -1)
	change(rec)
	j.count(rec, +1)
	j.dirtyNode(rec.Rank)
}

func (j *Job) recount() {
	j.nWaiting, j.nRunning, j.nRelaunching, j.nSucceeded, j.latestAlive, j.latestDown = 0, 0, 0, 0, 0, 0
	for _, rec := range j.nodes {
		j.count(rec, +1)
	}
	// A member whose rank has no record any more is down.
	if j.latest != nil {
		for _, r := range j.latest.Ranks {
			if _, ok := j.nodes[r]; !ok {
				j.latestDown++
			}
		}
	}
}

// roundOutdated: the latest round lost a member (restarting, failed, gone
// silent), or nodes wait that the round has room for (scale up, in units
// of NodeUnit). Members that succeeded are not missed. Once the rendezvous
// is closed no round is outdated: no other can form, and a member told to
// restart could only fail.
func (j *Job) roundOutdated() bool {
	if j.latest == nil || j.stopped || j.closed() {
		return false
	}
	if j.latestDown > 0 {
		return true
	}
	return j.check == nil && j.latestAlive < j.cfg.MaxNodes && j.nWaiting >= j.cfg.NodeUnit
}

// closed reports whether the rendezvous is closed: a node's workers
// succeeded (torch's agent closes it then). From then on no round forms,
// no member is told to restart, no rank is relaunched, and a pod that
// joins is told the job is done (docs/DESIGN.md §5.2). A succeeded node's
// record is never replaced, so this holds across a master restart.
func (j *Job) closed() bool { return j.nSucceeded > 0 }

// latestMember reports whether rank is a member of the latest round.
func (j *Job) latestMember(rank int) bool {
	if j.latest == nil {
		return false
	}
	_, ok := j.latest.index[rank]
	return ok
}

// settle runs after every call: it hands the ranks that freed to the pods
// that claimed them, and wakes the heartbeat waiters when the latest round
// just became outdated.
func (j *Job) settle(now time.Time) {
	j.handOver(now)
	o := j.roundOutdated()
	if o && !j.outdated {
		j.ready.WakeHeartbeats = true
	}
	j.outdated = o
}

// ---- requests ----

func (j *Job) validate(n NodeInfo) error {
	switch {
	case n.Pod == "" || len(n.Pod) > MaxPodName:
		return fmt.Errorf("%w: pod name must have 1 to %d bytes", ErrInvalid, MaxPodName)
	case n.Incarnation == "" || len(n.Incarnation) > MaxIncarnation:
		return fmt.Errorf("%w: incarnation must have 1 to %d bytes", ErrInvalid, MaxIncarnation)
	case n.Rank < -1 || n.Rank >= j.cfg.MaxNodes:
		return fmt.Errorf("%w: node rank %d outside [0, %d) (or -1)", ErrInvalid, n.Rank, j.cfg.MaxNodes)
	case len(n.Addr) > MaxAddr || len(n.Host) > MaxAddr:
		return fmt.Errorf("%w: address or host longer than %d bytes", ErrInvalid, MaxAddr)
	case n.Port < 0 || n.Port > 65535:
		return fmt.Errorf("%w: port %d outside [0, 65535]", ErrInvalid, n.Port)
	}
	return nil
}

// lookup finds the record of a calling pod incarnation, which must hold its
// rank.
func (j *Job) lookup(n NodeInfo) (*Node, error) {
	if err := j.validate(n); err != nil {
		return nil, err
	}
	rank := n.Rank
	if rank < 0 {
		r, ok := j.byPod[n.Pod]
		if !ok {
			return nil, fmt.Errorf("%w: pod %q has not joined", ErrUnknown, n.Pod)
		}
		rank = r
	}
	rec, ok := j.nodes[rank]
	if !ok || rec.Pod != n.Pod || rec.Incarnation != n.Incarnation {
		return nil, fmt.Errorf("%w: pod %q (this incarnation) does not hold rank %d", ErrUnknown, n.Pod, rank)
	}
	return rec, nil
}

// chooseRank picks a rank for a pod that asked the master to choose: the
// one it held before, else the lowest rank nobody alive holds.
func (j *Job) chooseRank(pod string) (int, error) {
	if r, ok := j.byPod[pod]; ok {
		return r, nil
	}
	for r := 0; r < j.cfg.MaxNodes; r++ {
		rec, ok := j.nodes[r]
		if !ok || !rec.State.alive() {
			return r, nil
		}
	}
	return 0, fmt.Errorf("%w: all %d ranks are held by live pods", ErrRankHeld, j.cfg.MaxNodes)
}

// Join registers a pod incarnation for the round after afterRound and
// returns the answer as it stands: repeated joins with the same afterRound
// are one join. A pod joining for a rank another live pod holds waits for
// it (claim: a replacement that arrived early) and takes it over once it
// frees; a pod whose rank was lost (failed, silent, relaunched) is its
// replacement at once.
func (j *Job) Join(n NodeInfo, afterRound int64, now time.Time) (JoinAnswer, error) {
	defer j.settle(now)
	if err := j.validate(n); err != nil {
		return JoinAnswer{}, err
	}
	if n.LocalWorldSize < 1 || n.LocalWorldSize > MaxLocalWorkers {
		return JoinAnswer{}, fmt.Errorf("%w: local world size %d outside [1, %d]", ErrInvalid, n.LocalWorldSize, MaxLocalWorkers)
	}
	if afterRound < 0 {
		return JoinAnswer{}, fmt.Errorf("%w: after_round %d is negative", ErrInvalid, afterRound)
	}
	if j.closed() {
		return j.joinClosed(n, afterRound, now), nil
	}
	if n.Rank < 0 {
		r, err := j.chooseRank(n.Pod)
		if err != nil {
			return JoinAnswer{}, err
		}
		n.Rank = r
	}
	// One pod, one live rank: a pod asking for a second one is refused.
	if old, ok := j.byPod[n.Pod]; ok && old != n.Rank {
		if o := j.nodes[old]; o != nil && o.Pod == n.Pod && o.State.alive() && o.Exclusion == nil {
			return JoinAnswer{}, fmt.Errorf("%w: pod %q holds rank %d, not %d", ErrRankHeld, n.Pod, old, n.Rank)
		}
	}
	rec := j.nodes[n.Rank]
	if j.stopped && (rec == nil || rec.Pod != n.Pod || rec.Incarnation != n.Incarnation) {
		// A stopped job takes nobody in: a pod that does not hold its
		// rank is told so and not recorded (it took the rank, and an
		// older incarnation took it back, TestSim seed 518538).
		return JoinAnswer{Rank: n.Rank, Excluded: j.stopExclusion()}, nil
	}
	if rec != nil && (rec.Pod != n.Pod || rec.Incarnation != n.Incarnation) && j.isFenced(n.Rank, n.Pod, n.Incarnation) {
		// An incarnation a newer one of its pod replaced: it would take
		// the rank back, and the newer one would take it again, without
		// end (a pod deleted by force while its container still ran,
		// recreated under its name). It must exit.
		j.logf("warn", "a replaced incarnation of a pod joined again; it is told to exit", "rank", n.Rank, "pod", n.Pod,
			"incarnation", n.Incarnation, "holder_incarnation", rec.Incarnation)
		return JoinAnswer{Rank: n.Rank, Excluded: j.outsider(rec, n.Rank, n.Pod, n.Incarnation)}, nil
	}
	switch {
	case rec == nil:
		rec = &Node{NodeInfo: n, State: Failed}
		j.nodes[n.Rank] = rec
		j.byPod[n.Pod] = n.Rank
		j.count(rec, +1)
		j.startWaiting(rec, n, afterRound, now)
	case rec.Pod == n.Pod && rec.Incarnation == n.Incarnation:
		rec.LastSeen, rec.LastCall = now, now
		switch {
		case rec.Exclusion != nil || rec.State == Failed || rec.State == Succeeded:
			// answered below: it must exit
		case rec.State == Running && rec.Round > afterRound && rec.Round == j.latestNumber():
			// the round it waits for is there (an older one is gone: the
			// node's answer was lost, and it joins the next,
			// lost_round_answer.txt)
		case rec.State == Joining && rec.AfterRound == afterRound:
			// the same join again
		default:
			// A member restarting its workers, or a join for a later round.
			j.startWaiting(rec, n, afterRound, now)
		}
	case rec.Pod != n.Pod && rec.State.alive():
		// A replacement that came before its rank freed (its pod deleted,
		// the master not told yet, or not gone silent long enough): it
		// waits for the rank (claim).
		j.claim(rec, n, afterRound, now)
	default:
		// A new incarnation: the same pod's restarted container, or a
		// replacement pod for a rank whose pod is gone.
		j.replace(rec, n, afterRound, now)
	}
	return j.Answer(n.Pod, n.Incarnation, n.Rank, afterRound), nil
}

// replace gives a rank to a new pod incarnation. The old one, if it was
// a member of the latest round, is gone from it.
func (j *Job) replace(rec *Node, n NodeInfo, afterRound int64, now time.Time) {
	if rec.Pod != n.Pod {
		if j.byPod[rec.Pod] == rec.Rank {
			delete(j.byPod, rec.Pod)
		}
		j.logf("info", "pod takes over rank", "rank", n.Rank, "pod", n.Pod, "replaces", rec.Pod,
			"relaunched", rec.Relaunching)
	} else {
		j.logf("info", "pod restarted", "rank", n.Rank, "pod", n.Pod)
		if rec.Incarnation != n.Incarnation {
			j.fence(rec.Rank, rec.Pod, rec.Incarnation)
		}
	}
	j.byPod[n.Pod] = n.Rank
	j.update(rec, func(rec *Node) {
		rec.Relaunching = false
		rec.Exclusion = nil
		rec.Checked = false
		rec.Step = 0
	})
	j.wake(rec.Rank) // the calls the old incarnation holds are answered now
	j.startWaiting(rec, n, afterRound, now)
}

// maxFenced bounds the replaced incarnations remembered per rank.
const maxFenced = 8

// fence remembers that pod's incarnation no longer holds rank: if it calls
// again it is told to exit (outsider), never given the rank back. A pod's
// restarted container never calls again; a second live container under the
// pod's name would, and take the rank back.
func (j *Job) fence(rank int, pod, incarnation string) {
	f := append(slices.Clone(j.fenced[rank]), pod+"/"+incarnation)
	j.fenced[rank] = f[max(0, len(f)-maxFenced):]
	j.dirtyNode(rank)
}

func (j *Job) isFenced(rank int, pod, incarnation string) bool {
	return slices.Contains(j.fenced[rank], pod+"/"+incarnation)
}

// outsider is what a pod incarnation that does not hold rank (rec holds
// it, or nobody) and claims nothing is told: the job is done, once the
// rendezvous is closed (unless a newer incarnation of the same pod
// replaced it); otherwise that the rank is another's (Replaced).
func (j *Job) outsider(rec *Node, rank int, pod, incarnation string) *Exclusion {
	if j.closed() && !j.isFenced(rank, pod, incarnation) {
		return jobSucceededExclusion()
	}
	switch {
	case rec == nil:
		return &Exclusion{Code: kferrors.CodeReplaced, Message: fmt.Sprintf("rank %d is now held by nobody", rank)}
	case rec.Pod == pod && j.isFenced(rank, pod, incarnation):
		return &Exclusion{Code: kferrors.CodeReplaced, Message: fmt.Sprintf(
			"rank %d is held by a newer incarnation of pod %s: two containers ran under one pod name (a pod deleted "+
				"by force while its container still ran, recreated under its name); this older one is fenced off", rank, pod)}
	case j.isFenced(rank, pod, incarnation):
		return &Exclusion{Code: kferrors.CodeReplaced, Message: fmt.Sprintf(
			"pod %s waited to replace pod %s on rank %d, and a newer pod claimed the rank after it: this one is fenced off",
			pod, rec.Pod, rank)}
	}
	return &Exclusion{Code: kferrors.CodeReplaced, Message: fmt.Sprintf("rank %d is now held by pod %s", rank, rec.Pod)}
}

func jobSucceededExclusion() *Exclusion {
	return &Exclusion{Code: kferrors.CodeJobSucceeded, Message: "the job succeeded while this node waited: the rendezvous is closed"}
}

// joinClosed answers a join once the rendezvous is closed: a member of the
// latest round asking again for it gets it; one that restarts its workers
// is ended at once (closeOut); any other pod (a late pod, a replacement)
// is told the job is done and is not recorded: it takes no rank, forms no
// round and outdates nobody's.
func (j *Job) joinClosed(n NodeInfo, afterRound int64, now time.Time) JoinAnswer {
	rank := n.Rank
	if rank < 0 {
		if r, ok := j.byPod[n.Pod]; ok {
			rank = r
		}
	}
	rec := j.nodes[rank]
	if rec != nil && rec.Pod == n.Pod && rec.Incarnation != n.Incarnation && rec.State.alive() && rec.Exclusion == nil &&
		j.latestMember(rank) && !j.isFenced(rank, n.Pod, n.Incarnation) {
		// The pod's container restarted while it was a member: its
		// training is lost, and no round can take it again. Told that job
		// is done, it would exit 0 and its pod would pass for finished.
		j.fence(rank, rec.Pod, rec.Incarnation)
		n.Rank = rank
		rec.NodeInfo = n
		j.wake(rank)
		j.fail(rec, kferrors.SystemFailure(kferrors.CodeRendezvousClosed, fmt.Sprintf(
			"pod %s restarted (a new incarnation) while a member of round %d, after another node's workers succeeded: "+
				"the rendezvous is closed and no round can take it", n.Pod, rec.Round), n.Pod, now), now)
		return j.Answer(n.Pod, n.Incarnation, rank, afterRound)
	}
	if rec == nil || rec.Pod != n.Pod || rec.Incarnation != n.Incarnation {
		return JoinAnswer{Rank: rank, Excluded: j.outsider(rec, rank, n.Pod, n.Incarnation)}
	}
	rec.LastSeen, rec.LastCall = now, now
	if rec.Exclusion == nil && (rec.State == Joining || rec.State == Running && (rec.Round <= afterRound || rec.Round != j.latestNumber())) {
		j.closeOut(rec, now)
	}
	return j.Answer(n.Pod, n.Incarnation, rank, afterRound)
}

// closeRendezvous runs at the first success (closed): a health check in
// progress ends, the replacements that wait for a rank are told the job is
// done, and every node that waits for a round is closed out.
func (j *Job) closeRendezvous(now time.Time) {
	j.logf("info", "rendezvous closed: a node's workers succeeded; no round forms from now on", "waiting", j.nWaiting,
		"claims", len(j.claims))
	j.check = nil
	j.belowMinSince = time.Time{}
	for _, rank := range slices.Sorted(maps.Keys(j.claims)) {
		delete(j.claims, rank)
		j.dirtyClaim(rank)
		j.wake(rank)
	}
	for _, rec := range j.sortedNodes() {
		switch {
		case rec.State == Joining && rec.Exclusion == nil:
			j.closeOut(rec, now)
		case rec.Relaunching:
			// Decided before the close, its pod not here yet: no round can
			// take it now (it is told the job is done), so the rank waits
			// for nobody (TestSim seed 40: "relaunching" for good).
			j.update(rec, func(rec *Node) { rec.Relaunching = false })
			j.logf("info", "relaunch dropped: the rendezvous closed before its pod joined", "rank", rec.Rank, "pod", rec.Pod)
		}
	}
}

// closeOut ends a node that waits for a round once the rendezvous is
// closed. A member of the latest round (its workers restarting, after a
// failure or a restart the master asked for) will get no round: it fails
// at once with RendezvousClosed, no relaunch (torch's agent fails with
// RendezvousClosedError), instead of after the join timeout; its agent
// writes its workers' own error as its document. Any other node is told
// the job is done (JobSucceeded: it exits 0) and counts as succeeded.
func (j *Job) closeOut(rec *Node, now time.Time) {
	if j.latestMember(rec.Rank) {
		j.fail(rec, kferrors.SystemFailure(kferrors.CodeRendezvousClosed, fmt.Sprintf(
			"pod %s joined again to restart its workers, but another node's workers succeeded: the rendezvous is closed and no round can take it",
			rec.Pod), rec.Pod, now), now)
		return
	}
	j.update(rec, func(rec *Node) {
		rec.State = Succeeded
		rec.Exclusion = jobSucceededExclusion()
	})
	j.logf("info", "waiting node told the job is done: the rendezvous is closed", "rank", rec.Rank, "pod", rec.Pod)
	j.wake(rec.Rank)
}

func (j *Job) startWaiting(rec *Node, n NodeInfo, afterRound int64, now time.Time) {
	j.update(rec, func(rec *Node) {
		rec.NodeInfo = n
		rec.State = Joining
		rec.AfterRound = afterRound
		rec.JoinedAt = now
		rec.LastSeen, rec.LastCall = now, now
	})
	j.lastJoin = now
	if j.check != nil && !j.check.participates(rec.Rank) {
		j.logf("info", "node joined during a health check; it waits for the next one", "rank", rec.Rank, "pod", rec.Pod)
	}
	j.tryForm(now)
}

// Answer is the current answer to a pending join (a pure query: the loop
// asks it again for the waiters it wakes).
func (j *Job) Answer(pod, incarnation string, rank int, afterRound int64) JoinAnswer {
	if rank < 0 {
		r, ok := j.byPod[pod]
		if !ok {
			if j.closed() {
				return JoinAnswer{Rank: rank, Excluded: jobSucceededExclusion()}
			}
			return JoinAnswer{Rank: rank, Excluded: &Exclusion{Code: kferrors.CodeReplaced, Message: fmt.Sprintf("pod %s holds no rank", pod)}}
		}
		rank = r
	}
	a := JoinAnswer{Rank: rank}
	rec := j.nodes[rank]
	if c := j.claims[rank]; c != nil && c.n.Pod == pod && c.n.Incarnation == incarnation &&
		(rec == nil || rec.Pod != pod || rec.Incarnation != incarnation) {
		switch {
		case j.stopped:
			a.Excluded = j.stopExclusion()
		case c.expired:
			a.Excluded = c.exclusion(rec, j.cfg.PendTimeout, j.cfg.HeartbeatTimeout)
		default:
			a.Waiting = j.nWaiting
		}
		return a
	}
	if rec == nil || rec.Pod != pod || rec.Incarnation != incarnation {
		a.Excluded = j.outsider(rec, rank, pod, incarnation)
		return a
	}
	switch {
	case rec.Exclusion != nil:
		e := *rec.Exclusion
		a.Excluded = &e
		return a
	case j.stopped:
		a.Excluded = j.stopExclusion()
		return a
	}
	switch rec.State {
	case Running:
		if j.latest != nil && rec.Round == j.latest.Number && rec.Round > afterRound {
			as, _ := j.latest.assignment(rank)
			a.Round = &as
			return a
		}
	case Joining:
		if j.closed() && !j.latestMember(rank) {
			a.Excluded = jobSucceededExclusion()
			return a
		}
		if c := j.check; c != nil {
			if t, ok := c.task(rank, j.cfg.CheckTimeout); ok {
				a.Check = &t
				return a
			}
		}
	case Succeeded:
		a.Excluded = &Exclusion{Code: kferrors.CodeJobStopped, Message: "this node already succeeded"}
		return a
	}
	a.Waiting = j.nWaiting
	return a
}

// waiting are the nodes waiting for a round, in rank order.
func (j *Job) waiting() []*Node {
	w := make([]*Node, 0, j.nWaiting)
	for _, rec := range j.nodes {
		if rec.State == Joining && rec.Exclusion == nil {
			w = append(w, rec)
		}
	}
	slices.SortFunc(w, func(a, b *Node) int { return cmp.Compare(a.Rank, b.Rank) })
	return w
}

// tryForm completes a round if the waiting nodes allow it, or starts the
// health check first (docs/DESIGN.md §5.2, §5.4).
func (j *Job) tryForm(now time.Time) {
	if j.closed() {
		j.belowMinSince = time.Time{} // nobody waits for a round that cannot form
	}
	if j.stopped || j.check != nil || j.closed() {
		return
	}
	n := j.nWaiting
	if n == 0 {
		j.belowMinSince = time.Time{}
		return
	}
	if n < j.cfg.MinNodes {
		if j.belowMinSince.IsZero() {
			j.belowMinSince = now
		}
		return
	}
	j.belowMinSince = time.Time{}
	complete := false
	switch {
	case n >= j.cfg.MaxNodes:
		complete = true
	case j.cfg.ExpectedNodes > 0 && n >= j.cfg.ExpectedNodes && j.nRunning == 0:
		// Not while nodes still run an older round: told to restart, they
		// are coming. Without them a round of the first few to rejoin
		// would outdate itself at once, and the rest would form the
		// next without those, round after round (TestSim, sim_7.txt:
		// more nodes than expected, a scale-up or a late pod).
		complete = true
	case j.latest != nil && j.nRunning == 0 && j.nRelaunching == 0:
		// A re-rendezvous: every living node is here and no replacement is
		// on its way; the last call would only delay the restart.
		complete = true
	case !now.Before(j.lastJoin.Add(j.cfg.WaitingTimeout)):
		complete = true
	}
	if !complete {
		return
	}
	take := min(n, j.cfg.MaxNodes)
	take -= take % j.cfg.NodeUnit
	if take < j.cfg.MinNodes {
		return
	}
	w := j.waiting()
	if j.cfg.NetworkCheck {
		for _, rec := range w {
			if !rec.Checked {
				j.startCheck(w, now)
				return
			}
		}
	}
	j.complete(w[:take], now)
}

func (j *Job) complete(members []*Node, now time.Time) {
	var number int64 = 1
	if j.latest != nil {
		number = j.latest.Number + 1
	}
	r := &Round{Number: number, CompletedAt: now}
	for _, rec := range members {
		r.Ranks = append(r.Ranks, rec.Rank)
		r.LocalWorldSizes = append(r.LocalWorldSizes, rec.LocalWorldSize)
		r.pods = append(r.pods, rec.Pod+"/"+rec.Incarnation)
	}
	r.MasterAddr, r.MasterPort = members[0].Addr, members[0].Port
	if prev := j.latest; prev != nil && len(prev.pods) == len(prev.Ranks) {
		r.DepartedKnown = true
		for _, p := range prev.pods {
			if !slices.Contains(r.pods, p) {
				r.Departed++
				if t, ok := j.failedAt[p]; ok && (r.DepartedSince.IsZero() || t.Before(r.DepartedSince)) {
					r.DepartedSince = t
				}
			}
		}
	}
	r.build()
	j.failedAt = nil
	for _, rec := range members {
		j.update(rec, func(rec *Node) {
			rec.State = Running
			rec.Round = number
		})
		j.wake(rec.Rank)
	}
	j.latest = r
	j.recount()
	j.ready.Dirty.Round = true
	j.ready.Rounds = append(j.ready.Rounds, number)
	j.ready.WakeHeartbeats = true // members of older rounds learn of it
	pods := make([]string, 0, min(len(members), 16))
	for _, rec := range members[:min(len(members), 16)] {
		pods = append(pods, rec.Pod)
	}
	j.logf("info", "rendezvous round completed", "round", number, "group_world_size", len(members), "departed", r.Departed,
		"world_size", r.world, "master_addr", r.MasterAddr, "master_port", r.MasterPort, "pods", pods,
		"still_waiting", j.nWaiting)
}

// Heartbeat records that a pod lives and answers with what it must do. A
// pod whose rank another pod took over is told to exit (it is fenced off).
func (j *Job) Heartbeat(n NodeInfo, round, step int64, now time.Time) (HeartbeatAnswer, error) {
	defer j.settle(now)
	rec, err := j.lookup(n)
	if err != nil {
		if n.Rank < 0 || !errors.Is(err, ErrUnknown) {
			return HeartbeatAnswer{}, err
		}
		if c := j.claims[n.Rank]; c != nil && c.n.Pod == n.Pod && c.n.Incarnation == n.Incarnation {
			c.lastSeen = now // a replacement waiting for its rank calls too
		} else if _, held := j.nodes[n.Rank]; !held && !j.closed() {
			return HeartbeatAnswer{}, err
		}
		return j.HeartbeatAnswer(n.Pod, n.Incarnation, n.Rank, round), nil
	}
	rec.LastSeen, rec.LastCall = now, now
	if step >= 0 {
		rec.Step = step
	}
	return j.HeartbeatAnswer(n.Pod, n.Incarnation, rec.Rank, round), nil
}

func (j *Job) latestNumber() int64 {
	if j.latest == nil {
		return 0
	}
	return j.latest.Number
}

// HeartbeatAnswer is what pod's incarnation at rank, running in round,
// must do now (a pure query: the loop asks it again for the heartbeats it
// holds). An incarnation that does not hold the rank is told to exit, never
// to restart (a restart would have it join and take the rank back), unless
// it is a replacement waiting for the rank (claim).
func (j *Job) HeartbeatAnswer(pod, incarnation string, rank int, round int64) HeartbeatAnswer {
	a := HeartbeatAnswer{LatestRound: j.latestNumber()}
	rec := j.nodes[rank]
	if rec == nil || rec.Pod != pod || rec.Incarnation != incarnation {
		if c := j.claims[rank]; c != nil && c.n.Pod == pod && c.n.Incarnation == incarnation {
			if e := j.Answer(pod, incarnation, rank, c.afterRound).Excluded; e != nil {
				a.Action, a.Exit = Exit, e
			}
			return a
		}
		if rec != nil || j.closed() {
			a.Action, a.Exit = Exit, j.outsider(rec, rank, pod, incarnation)
		}
		return a
	}
	switch {
	case rec.Exclusion != nil:
		e := *rec.Exclusion
		a.Action, a.Exit = Exit, &e
	case j.stopped:
		a.Action, a.Exit = Exit, j.stopExclusion()
	case rec.State == Running && round > 0 && (round != rec.Round || j.outdated || rec.Round < a.LatestRound):
		// rec.Round < LatestRound: a round formed without this running node
		// (its heartbeat was elsewhere while the outdated round's last call
		// ran, testdata/scenarios/missed_round.txt): it must rejoin, or it
		// would wait forever on peers that left its round.
		a.Action = Restart
	}
	return a
}

// Leave records a pod's end. A success leaves its round alone; a failure
// gets a relaunch decision, and the round's other members restart.
//
// f is the pod's failure as its agent reports it, the same
// kferrors.Failure its error document carries; the master reads its Code,
// Message, Recoverable and Time.
func (j *Job) Leave(n NodeInfo, succeeded bool, f kferrors.Failure, now time.Time) (Decision, error) {
	defer j.settle(now)
	rec, err := j.lookup(n)
	if err != nil {
		if c := j.claims[n.Rank]; n.Rank >= 0 && c != nil && c.n.Pod == n.Pod && c.n.Incarnation == n.Incarnation {
			// A replacement that never got its rank gives up its claim.
			delete(j.claims, n.Rank)
			j.dirtyClaim(n.Rank)
			j.logf("info", "replacement pod left before its rank freed", "rank", n.Rank, "pod", n.Pod)
			return Decision{}, nil
		}
		return Decision{}, err
	}
	if succeeded {
		if rec.State != Succeeded && rec.State != Failed {
			wasClosed := j.closed()
			j.update(rec, func(rec *Node) { rec.State = Succeeded })
			j.logf("info", "node succeeded", "rank", rec.Rank, "pod", rec.Pod)
			j.checkReportMissing(rec.Rank, "the node left")
			if !wasClosed {
				j.closeRendezvous(now)
			}
			j.tryForm(now)
		}
		return Decision{}, nil
	}
	if rec.State == Failed {
		return j.lastDecision(rec.Rank), nil // a retried Leave, or one after an exclusion
	}
	if len(f.Code) > 256 || len(f.Message) > 64<<10 {
		return Decision{}, fmt.Errorf("%w: failure code or message too long", ErrInvalid)
	}
	return j.fail(rec, f, now), nil
}

func (j *Job) lastDecision(rank int) Decision {
	for i := len(j.decisions) - 1; i >= 0; i-- {
		if j.decisions[i].Rank == rank && j.decisions[i].Kind != StopJob {
			return j.decisions[i]
		}
	}
	return Decision{}
}

// PodGone is the owner of the pods reporting that a pod ended without its
// agent saying so (OOMKilled, evicted, deleted, its node lost). A pod that
// no longer holds a live rank is ignored.
func (j *Job) PodGone(pod string, f kferrors.Failure, now time.Time) (Decision, bool) {
	defer j.settle(now)
	rank, ok := j.byPod[pod]
	if !ok {
		return Decision{}, false
	}
	rec := j.nodes[rank]
	if rec.Pod != pod || !rec.State.alive() {
		return Decision{}, false
	}
	return j.fail(rec, f, now), true
}

// NodeNotReady is the Kubernetes node controller's word that a pod's node
// stopped reporting (its NodeNotReady event on the pod): Node is the node,
// At when the controller said so, Condition the node's Ready condition in
// words when the master could read it.
type NodeNotReady struct {
	Pod, Node, Condition string
	At                   time.Time
}

// lost is the NodeLost message of a pod silent for silence on the node.
func (n NodeNotReady) lost(pod string, silence time.Duration) string {
	msg := fmt.Sprintf("pod %s lost its node %s: the node controller found the node not ready at %s, and the pod made no call for %s",
		pod, n.Node, n.At.UTC().Format(time.RFC3339), silence.Round(time.Second))
	if n.Condition != "" {
		msg += "; the node's " + n.Condition
	}
	return msg
}

// NodeNotReady notes that a live pod's node is not ready. A node that
// stopped reporting may still run the pod (a kubelet down, the API server
// unreachable): the pod is taken out only when its agent is silent too,
// then after a third of the heartbeat timeout instead of all of it, and
// its NodeLost names the node; the relaunch avoids that node. An agent
// that keeps calling keeps its pod training.
func (j *Job) NodeNotReady(n NodeNotReady, now time.Time) (Decision, bool) {
	defer j.settle(now)
	rank, ok := j.byPod[n.Pod]
	if !ok {
		return Decision{}, false
	}
	rec := j.nodes[rank]
	if rec.Pod != n.Pod || !rec.State.alive() || rec.Exclusion != nil {
		return Decision{}, false
	}
	if j.notReady == nil {
		j.notReady = make(map[string]NodeNotReady)
	}
	key := rec.Pod + "/" + rec.Incarnation
	if _, seen := j.notReady[key]; !seen {
		j.logf("warn", "the node controller says a pod's node is not ready", "rank", rec.Rank, "pod", rec.Pod, "node", n.Node,
			"at", n.At, "last_seen", rec.LastSeen, "taken_out_if_silent_for", j.notReadySilence())
	}
	j.notReady[key] = n
	if silence := now.Sub(rec.LastSeen); silence > j.notReadySilence() {
		j.ready.Dead = append(j.ready.Dead, rec.Rank)
		return j.fail(rec, kferrors.SystemFailure(kferrors.CodeNodeLost, n.lost(rec.Pod, silence), rec.Pod, now), now), true
	}
	return Decision{}, false
}

// nodeNotReady is what the node controller said of rec's node, if anything
// since rec's agent started.
func (j *Job) nodeNotReady(rec *Node) (NodeNotReady, bool) {
	n, ok := j.notReady[rec.Pod+"/"+rec.Incarnation]
	return n, ok
}

// notReadySilence is how long an agent on a node that is not ready may be
// silent before its pod is taken out: two of the agents' default heartbeat
// intervals at the default timeout.
func (j *Job) notReadySilence() time.Duration { return j.cfg.HeartbeatTimeout / 3 }

// silenceAllowed is how long rec's agent may make no call before the sweep
// takes its pod out.
func (j *Job) silenceAllowed(rec *Node) time.Duration {
	if _, ok := j.nodeNotReady(rec); ok {
		return j.notReadySilence()
	}
	return j.cfg.HeartbeatTimeout
}

// fail takes a live pod's rank out: a relaunch decision, an exclusion that
// answers the pod's every later call (it is fenced off), a wake-up of the
// others, and a stop of the job if too few nodes can run.
func (j *Job) fail(rec *Node, f kferrors.Failure, now time.Time) Decision {
	d := j.takeOut(rec, f, now)
	j.checkReportMissing(rec.Rank, f.Code)
	j.checkViable(now)
	j.tryForm(now)
	return d
}

// takeOut is fail without its consequences for the job, for callers that
// take several nodes out at once.
func (j *Job) takeOut(rec *Node, f kferrors.Failure, now time.Time) Decision {
	if f.Time.IsZero() {
		f.Time = now
	}
	if j.failedAt == nil {
		j.failedAt = make(map[string]time.Time)
	}
	j.failedAt[rec.Pod+"/"+rec.Incarnation] = f.Time
	delete(j.notReady, rec.Pod+"/"+rec.Incarnation)
	kind, counted, why := j.cfg.Relaunch.Decide(f.Code, f.Recoverable, rec.Relaunches)
	if j.closed() && kind != relaunch.None {
		kind, counted, why = relaunch.None, false, "the rendezvous is closed (a node's workers succeeded): no round can take a relaunched pod"
	}
	msg := f.Message
	if why != "" {
		msg = strings.TrimSuffix(why+"; "+msg, "; ")
	}
	j.update(rec, func(rec *Node) {
		rec.State = Failed
		rec.Checked = false
		if counted {
			rec.Relaunches++
		}
		rec.Relaunching = kind != relaunch.None
		rec.Exclusion = &Exclusion{Code: f.Code, Message: f.Message, Relaunch: rec.Relaunching}
	})
	d := j.decide(Decision{Kind: kind, Rank: rec.Rank, Pod: rec.Pod, Host: rec.Host, Reason: f.Code, Message: msg, Counted: counted, Time: now})
	j.wake(rec.Rank)
	return d
}

func (j *Job) decide(d Decision) Decision {
	j.decisionSeq++
	d.Seq = j.decisionSeq
	j.decisions = append(j.decisions, d)
	j.ready.Decided = append(j.ready.Decided, d)
	j.ready.Dirty.Decisions = append(j.ready.Dirty.Decisions, d)
	j.ready.Dirty.Job = true
	j.logf("info", "relaunch decision", "seq", d.Seq, "kind", KindName(d.Kind), "rank", d.Rank, "pod", d.Pod,
		"host", d.Host, "reason", d.Reason, "counted", d.Counted, "message", d.Message)
	return d
}

// checkViable stops the job when fewer than MinNodes can still run: the
// live ranks, those being relaunched, and those that succeeded.
func (j *Job) checkViable(now time.Time) {
	if j.stopped || j.closed() {
		// Closed: no round forms any more, so stopping gains nothing; the
		// members still running finish, or fail, on their own.
		return
	}
	possible := 0
	var lost []int
	for _, rec := range j.nodes {
		switch {
		case rec.State.alive() && rec.Exclusion == nil, rec.Relaunching, rec.State == Succeeded:
			possible++
		default:
			lost = append(lost, rec.Rank)
		}
	}
	if possible >= j.cfg.MinNodes || len(lost) == 0 {
		return
	}
	slices.Sort(lost)
	parts := make([]string, len(lost))
	for i, r := range lost {
		rec := j.nodes[r]
		code := ""
		if rec.Exclusion != nil {
			code = rec.Exclusion.Code
		}
		parts[i] = fmt.Sprintf("%d (%s, %s)", r, rec.Pod, code)
	}
	j.stop(fmt.Sprintf("fewer than %d nodes can run: lost for good rank %s", j.cfg.MinNodes, strings.Join(parts, ", ")), now)
}

func (j *Job) stop(reason string, now time.Time) {
	j.stopped = true
	j.stopReason = reason
	j.check = nil
	j.ready.Dirty.Job = true
	j.decide(Decision{Kind: StopJob, Rank: -1, Reason: kferrors.CodeJobStopped, Message: reason, Time: now})
	j.ready.WakeAll = true
	j.logf("warn", "job stopped", "reason", reason)
}

func (j *Job) stopExclusion() *Exclusion {
	return &Exclusion{Code: kferrors.CodeJobStopped, Message: "the master stopped the job: " + j.stopReason}
}

// sweepEvery bounds how late a heartbeat or join timeout is noticed; the
// sweep is linear in the nodes, so it does not run on every call.
const sweepEvery = time.Second

// Tick advances time: heartbeat, join, check and pend timeouts, and the
// last call.
func (j *Job) Tick(now time.Time) {
	defer j.settle(now)
	if j.stopped {
		return
	}
	if now.Sub(j.lastSweep) >= j.sweepPeriod() || j.lastSweep.After(now) {
		j.lastSweep = now
		j.sweep(now)
	}
	if j.check != nil {
		j.checkTick(now)
	}
	j.expireClaims(now)
	if !j.stopped && !j.belowMinSince.IsZero() && now.Sub(j.belowMinSince) >= j.cfg.PendTimeout {
		j.stop(fmt.Sprintf("only %d of at least %d nodes joined within the pend timeout %s",
			j.nWaiting, j.cfg.MinNodes, j.cfg.PendTimeout), now)
		return
	}
	j.tryForm(now)
}

// Stalled tells the job that the master could not answer for held, up to
// now: its loop waited on the state (a write that did not go through, a
// snapshot, the check that no newer master claimed it). No node can be
// heard meanwhile, so that time is not counted as anyone's silence: every
// live node's and claimant's heartbeat timeout, and a health check
// round's deadline, move later by held less stallGrace. (Ordinary writes
// are shorter than stallGrace and move nothing: a master that is busy
// writing still answers every call within one.)
func (j *Job) Stalled(held time.Duration, now time.Time) {
	credit := held - j.stallGrace()
	if credit <= 0 || j.stopped {
		return
	}
	later := func(t time.Time) time.Time {
		if t = t.Add(credit); t.After(now) {
			return now
		}
		return t
	}
	for _, rec := range j.nodes {
		if rec.State.alive() {
			rec.LastSeen = later(rec.LastSeen)
		}
	}
	for _, c := range j.claims {
		c.lastSeen = later(c.lastSeen)
	}
	if j.check != nil {
		j.check.deadline = j.check.deadline.Add(credit)
	}
	j.logf("warn", "the master could not answer while it waited on its state; that time is not counted as the nodes' silence",
		"held", held, "heartbeat_timeouts_moved_by", credit)
}

// stallGrace is how long the state may hold the master before Stalled
// moves anyone's timeout: the sweep's own period, within which a timeout
// is noticed anyway.
func (j *Job) stallGrace() time.Duration {
	return min(sweepEvery, j.cfg.HeartbeatTimeout/4)
}

func (j *Job) sweepPeriod() time.Duration {
	return min(sweepEvery, j.cfg.HeartbeatTimeout/4, j.cfg.JoinTimeout/4)
}

func (j *Job) sweep(now time.Time) {
	var silent, late []*Node
	for _, rec := range j.nodes {
		if !rec.State.alive() || rec.Exclusion != nil {
			continue
		}
		if now.Sub(rec.LastSeen) > j.silenceAllowed(rec) {
			silent = append(silent, rec)
		} else if rec.State == Joining && now.Sub(rec.JoinedAt) >= j.cfg.JoinTimeout {
			late = append(late, rec)
		}
	}
	byRank := func(a, b *Node) int { return cmp.Compare(a.Rank, b.Rank) }
	slices.SortFunc(silent, byRank)
	slices.SortFunc(late, byRank)
	// Every node the sweep ends is taken out before the job looks at what
	// is left: failing them one by one, the first one's failure could
	// complete a round with the next, lost a moment later (TestSim,
	// sim_8.txt).
	for _, rec := range silent {
		j.logf("warn", "node lost: no call within the heartbeat timeout", "rank", rec.Rank, "pod", rec.Pod,
			"last_seen", rec.LastSeen, "heartbeat_timeout", j.cfg.HeartbeatTimeout)
		j.ready.Dead = append(j.ready.Dead, rec.Rank)
		msg := fmt.Sprintf("pod %s made no call for %s (heartbeat timeout)", rec.Pod, j.cfg.HeartbeatTimeout)
		if n, ok := j.nodeNotReady(rec); ok {
			msg = n.lost(rec.Pod, now.Sub(rec.LastSeen))
		}
		f := kferrors.SystemFailure(kferrors.CodeNodeLost, msg, rec.Pod, now)
		j.takeOut(rec, f, now)
		j.checkReportMissing(rec.Rank, f.Code)
	}
	for _, rec := range late {
		f := kferrors.SystemFailure(kferrors.CodeRendezvousTimeout,
			fmt.Sprintf("pod %s waited %s for a rendezvous round (join timeout)", rec.Pod, j.cfg.JoinTimeout), rec.Pod, now)
		j.takeOut(rec, f, now)
		j.checkReportMissing(rec.Rank, f.Code)
	}
	if len(silent)+len(late) > 0 {
		j.checkViable(now)
		j.tryForm(now)
	}
}

// Deadline is the earliest time a Tick can change something; zero if none.
func (j *Job) Deadline() time.Time {
	var d time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	if j.stopped {
		return d
	}
	if len(j.nodes) > 0 {
		earlier(j.lastSweep.Add(j.sweepPeriod()))
	}
	if j.check != nil {
		earlier(j.check.deadline)
	} else if j.nWaiting >= j.cfg.MinNodes && j.nWaiting < j.cfg.MaxNodes {
		earlier(j.lastJoin.Add(j.cfg.WaitingTimeout))
	}
	if !j.belowMinSince.IsZero() {
		earlier(j.belowMinSince.Add(j.cfg.PendTimeout))
	}
	for _, c := range j.claims {
		if !c.expired {
			earlier(c.since.Add(j.cfg.PendTimeout))
			earlier(c.lastSeen.Add(j.cfg.HeartbeatTimeout))
		}
	}
	return d
}

func (j *Job) sortedNodes() []*Node {
	out := make([]*Node, 0, len(j.nodes))
	for _, rec := range j.nodes {
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b *Node) int { return cmp.Compare(a.Rank, b.Rank) })
	return out
}

// ---- replacements that arrive before their rank frees ----

// claim is a pod that joined for a rank another live pod holds: on
// Kubernetes the operator creates the replacement of a deleted pod at once,
// before the master learns of the deletion (the pod watcher, a failed
// Leave) or the old pod goes silent for the heartbeat timeout. The claim
// waits for the rank to free and then takes it over (handOver), as a
// replacement joining a freed rank does; if the rank is still held after
// PendTimeout, the claimant is told to exit with CodeRankHeld. A claimant
// that stops calling for the heartbeat timeout loses its claim. Claims are
// persisted (ClaimRecord) so that a restarted master does not answer the
// claimant's heartbeat with Replaced before its next join; their times are
// not: a restored claim gets the heartbeat grace and the pend timeout again
// from the restart, as restored nodes get their grace.
type claim struct {
	n               NodeInfo
	afterRound      int64
	since, lastSeen time.Time
	expired         bool
}

// exclusion is what a claimant whose pend timeout ran out is told. It says
// whether the holder still calls: after a master restart a holder that has
// not called yet keeps its rank for the heartbeat timeout from the restart,
// and "still calls the master" would send the user looking for a pod that
// may be long gone.
func (c *claim) exclusion(holder *Node, pend, heartbeatTimeout time.Duration) *Exclusion {
	who, calls := "another pod", "still holds the rank"
	switch {
	case holder == nil:
	case holder.LastCall.IsZero():
		who = "pod " + holder.Pod
		calls = fmt.Sprintf("still holds the rank, but has made no call since the master restarted: it keeps the rank until it has been silent for the heartbeat timeout (%s) from the restart", heartbeatTimeout)
	default:
		who = "pod " + holder.Pod
		calls = "still holds the rank and calls the master (its latest call at " + holder.LastCall.UTC().Format(time.RFC3339) + ")"
	}
	return &Exclusion{Code: kferrors.CodeRankHeld, Message: fmt.Sprintf(
		"pod %s waited %s (pend timeout) to replace %s on rank %d; that pod %s", c.n.Pod, pend, who, c.n.Rank, calls)}
}

// claim records (or renews) n's claim on the rank rec's live pod holds.
// The latest claimant wins: a replacement that was itself replaced is told
// so (CodeReplaced) on its next call.
func (j *Job) claim(rec *Node, n NodeInfo, afterRound int64, now time.Time) {
	c := j.claims[rec.Rank]
	if c != nil && c.n.Pod == n.Pod && c.n.Incarnation == n.Incarnation {
		if c.afterRound != afterRound {
			j.dirtyClaim(rec.Rank) // only then: a repeated join writes nothing
		}
		c.lastSeen, c.afterRound = now, afterRound
		return
	}
	if c != nil {
		// The claimant it supersedes is fenced off: its next join is
		// told Replaced instead of claiming the rank back, or two live
		// claimants would take the claim from each other without end,
		// each switch starting the pend timeout again (TestSim,
		// sim_174.txt).
		j.fence(rec.Rank, c.n.Pod, c.n.Incarnation)
		j.logf("info", "replacement pod superseded by a newer one for its rank", "rank", rec.Rank, "pod", c.n.Pod, "by", n.Pod)
	}
	j.claims[rec.Rank] = &claim{n: n, afterRound: afterRound, since: now, lastSeen: now}
	j.dirtyClaim(rec.Rank)
	j.logf("info", "replacement pod waits for its rank: the pod it replaces still holds it",
		"rank", rec.Rank, "pod", n.Pod, "holder", rec.Pod, "pend_timeout", j.cfg.PendTimeout)
}

// handOver gives every rank that freed (its pod failed, left, went silent,
// was reported gone) to the pod that claimed it.
func (j *Job) handOver(now time.Time) {
	if j.closed() {
		return // closeRendezvous ended the claims; a succeeded rank is never handed over
	}
	for _, rank := range slices.Sorted(maps.Keys(j.claims)) {
		c, rec := j.claims[rank], j.nodes[rank]
		if c.expired || j.stopped || rec == nil || rec.State.alive() {
			continue
		}
		delete(j.claims, rank)
		j.dirtyClaim(rank)
		if old, ok := j.byPod[c.n.Pod]; ok && old != rank {
			if o := j.nodes[old]; o != nil && o.Pod == c.n.Pod && o.State.alive() && o.Exclusion == nil {
				continue // it holds another rank meanwhile
			}
		}
		j.replace(rec, c.n, c.afterRound, now)
		j.wake(rank)
	}
}

// expireClaims ends the claims that waited PendTimeout (their pods are told
// to exit) and drops those whose pods stopped calling.
func (j *Job) expireClaims(now time.Time) {
	for _, rank := range slices.Sorted(maps.Keys(j.claims)) {
		c := j.claims[rank]
		switch {
		case c.expired:
		case now.Sub(c.lastSeen) > j.cfg.HeartbeatTimeout:
			delete(j.claims, rank)
			j.dirtyClaim(rank)
			j.logf("warn", "replacement pod stopped calling while it waited for its rank", "rank", rank, "pod", c.n.Pod)
		case now.Sub(c.since) >= j.cfg.PendTimeout:
			c.expired = true
			j.dirtyClaim(rank)
			holder := ""
			if rec := j.nodes[rank]; rec != nil {
				holder = rec.Pod
			}
			j.logf("warn", "replacement pod gave up: its rank is still held after the pend timeout", "rank", rank,
				"pod", c.n.Pod, "holder", holder, "pend_timeout", j.cfg.PendTimeout)
			j.wake(rank)
		}
	}
}

// Claimant is the pod waiting to take rank over from its live holder, if
// any.
func (j *Job) Claimant(rank int) (pod, incarnation string, ok bool) {
	c := j.claims[rank]
	if c == nil {
		return "", "", false
	}
	return c.n.Pod, c.n.Incarnation, true
}
