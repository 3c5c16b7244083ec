package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/master/relaunch"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Options configure a local job.
type Options struct {
	// Job is the job's name: the rendezvous id and the pods' prefix
	// (<job>-worker-<i>). Default "local".
	Job                string
	MinNodes, MaxNodes int
	NProcPerNode       int
	MaxRestarts        int
	// Slots is how many pods can run at once (default MaxNodes).
	Slots int
	// Launcher is the agents' --launcher (agent or command).
	Launcher string
	// Out is the job's folder: errors/ (the documents), state/ (the
	// master's), pods/<pod>.log (each agent's output), master.log. It must
	// not exist or be empty (ErrOutInUse): a job never reloads another's
	// state. NewOutFolder makes a new one.
	Out string
	// Chaos is what to inject, parsed and checked (ParseChaos, Check).
	Chaos []Chaos
	// Command is the training command each pod's agent runs.
	Command []string
	// Binary is the kfelastic binary the pods run (default: this one).
	Binary string
	// Memory is each pod's memory limit in bytes (0: none; an oom chaos
	// without one gets 2 GiB).
	Memory int64
	// MaxRelaunches is the counted relaunches per rank (default 3).
	MaxRelaunches int
	// NetworkCheck and ExcludeStraggler turn on the master's node check.
	NetworkCheck, ExcludeStraggler bool
	// HeartbeatInterval, HeartbeatTimeout, WaitingTimeout, CheckTimeout
	// are the master's (defaults 1 s, 8 s, 2 s, 60 s: local pods start in
	// about a second). HeartbeatTimeout is at least 8 s: an agent's
	// heartbeat is a long poll of 5 s (agent.MasterConfig).
	HeartbeatInterval, HeartbeatTimeout, WaitingTimeout, CheckTimeout time.Duration
	// Grace is how long a deleted pod gets between SIGTERM and SIGKILL,
	// and the agents' --stop-grace (default 5 s).
	Grace time.Duration
	// AgentArgs are more flags for every agent; Env more variables for
	// every pod.
	AgentArgs, Env []string
	// Network is "host" (pods share this machine's loopback), "netns"
	// (each pod its own network namespace on a bridge; needs root), or ""
	// for netns when a cut-network chaos needs it and it can be had.
	Network string
	// View receives the live view (default: nothing); Live redraws a table
	// in place (a terminal) instead of writing plain lines.
	View io.Writer
	Live bool
	// TF makes it a TensorFlow PS job (tfjob.go): pods <job>-chief-0,
	// <job>-ps-<i>, <job>-worker-<i> with TF_CONFIG, recreated under their
	// own name; MinNodes and MaxNodes are its replica count.
	TF *TF
	// MaxWorkers bounds the job's workers, MAX pods × workers per pod: 0
	// is what this machine holds (MachineWorkers), < 0 no bound.
	MaxWorkers int
}

// Validate says what Run would refuse in o, before anything starts. An
// empty Out passes: the command makes a new folder for it.
func (o Options) Validate() error {
	if o.Out == "" {
		o.Out = "(a new folder)"
	}
	return o.defaults()
}

func (o *Options) defaults() error {
	if o.Job == "" {
		o.Job = "local"
	}
	if errs := validation.IsDNS1123Label(o.Job); len(errs) > 0 {
		return fmt.Errorf("--job %q: pods are named <job>-worker-<i>, so the job's name must be a DNS label: %s", o.Job, strings.Join(errs, "; "))
	}
	if o.TF != nil {
		o.MinNodes, o.MaxNodes, o.NProcPerNode = o.TF.Replicas(), o.TF.Replicas(), 1
		if o.Network == "netns" {
			return errors.New("a TF job's pods share this machine's loopback (TF_CONFIG names their addresses there): no network namespaces")
		}
		o.Network = "host" // cut-network then freezes its pod
	}
	if o.MinNodes < 1 || o.MaxNodes < o.MinNodes {
		return fmt.Errorf("--nnodes %d:%d: want 1 ≤ MIN ≤ MAX", o.MinNodes, o.MaxNodes)
	}
	if o.NProcPerNode < 1 {
		o.NProcPerNode = 1
	}
	if o.Slots <= 0 {
		o.Slots = o.MaxNodes
	}
	if longest := o.Job + "-worker-" + strconv.Itoa(o.MaxNodes-1); len(longest) > validation.DNS1123LabelMaxLength {
		return fmt.Errorf("--job %q: its pods' names (%s) would be longer than %d characters; shorten it", o.Job, longest, validation.DNS1123LabelMaxLength)
	}
	if err := checkWorkers(o.MaxNodes*o.NProcPerNode, o.MaxWorkers); err != nil {
		return err
	}
	if o.Launcher == "" {
		o.Launcher = "agent"
	}
	if len(o.Command) == 0 {
		return errors.New("no training command (after --)")
	}
	if o.Out == "" {
		return errors.New("no output folder (--out)")
	}
	if o.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("the kfelastic binary: %w", err)
		}
		o.Binary = exe
	} else if err := checkExecutable(o.Binary); err != nil {
		return fmt.Errorf("--binary: %w", err)
	}
	if o.MaxRelaunches == 0 {
		o.MaxRelaunches = 3
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&o.HeartbeatInterval, time.Second}, {&o.HeartbeatTimeout, minHeartbeatTimeout}, {&o.WaitingTimeout, 2 * time.Second},
		{&o.CheckTimeout, 60 * time.Second}, {&o.Grace, 5 * time.Second}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	o.HeartbeatTimeout = max(o.HeartbeatTimeout, minHeartbeatTimeout)
	for _, c := range o.Chaos {
		if err := c.Check(o.MaxNodes, o.NProcPerNode); err != nil {
			return err
		}
		if c.Action == OOM && o.Memory == 0 {
			o.Memory = 2 << 30
		}
	}
	if o.View == nil {
		o.View = io.Discard
	}
	return nil
}

// setupNetwork gives pods network namespaces when asked, or when a
// cut-network needs them and this machine can (root, iproute2).
func (e *Engine) setupNetwork() error {
	want := e.opts.Network == "netns"
	if e.opts.Network == "" {
		for _, c := range e.opts.Chaos {
			want = want || c.Action == CutNetwork
		}
	}
	if !want {
		return nil
	}
	n, why := newNetwork(e.jobMark)
	if n == nil {
		if e.opts.Network == "netns" {
			return fmt.Errorf("network namespaces: %s", why)
		}
		e.note("network", "no network namespaces for the pods (%s): cut-network freezes its pod instead", why)
		return nil
	}
	e.net = n
	e.note("network", "each pod in its own network namespace on bridge %s (%s.0/24; the master at %s)", n.bridge, n.subnet, n.gateway())
	return nil
}

// minHeartbeatTimeout is above the agents' heartbeat long poll (5 s, which
// they ask the master to hold), with room for a loaded machine.
const minHeartbeatTimeout = 8 * time.Second

// Result is how a local job ended.
type Result struct {
	// Succeeded: the master did not stop the job and at least MinNodes
	// ranks' last pods finished their training (a TF job: its chief
	// succeeded).
	Succeeded bool
	// Message is the root cause as the Flyte UI shows it ("" without any
	// error document); Recoverable as the plugin would retry.
	Message     string
	Recoverable bool
	// Documents is the error prefix (file://<out>/errors).
	Documents string
	// Pods is every pod the job had.
	Pods []Pod
	// Stopped is the master's reason when it stopped the job.
	Stopped string
	// Recovery is, for each chaos action that fired, how long from the
	// action to the first training step after a round formed again (zero
	// when training did not resume after it).
	Recovery []time.Duration
}

// Engine runs one elastic job on this machine: the master in-process, one
// kfelastic agent process per pod, each pod its own process group (and
// cgroup where there are cgroups). It is the I/O around the Job's
// bookkeeping: it feeds the Job what its processes and the master do, and
// carries out what the Job asks. It is the master's PodOwner (it carries
// out relaunch decisions as the training operator would, and reports pods
// that die without their agent saying so) and hears the master's rounds
// (master.Options.OnRound); a TF job's pods have their own owner (tfOwner).
type Engine struct {
	opts   Options
	log    *slog.Logger
	mlog   *slog.Logger
	limits *Limits
	net    *network // nil: pods share the loopback
	view   *view
	// jobMark is in every pod's environment: tests (and people) find every
	// process a job started by it.
	jobMark   string
	errURL    string
	tokenPath string
	token     string
	wake      chan struct{}
	mctx      context.Context
	// runCtx is the run's context: once it ended, no pod starts, so
	// that a stop reaches a job still starting its pods (one at a
	// time, under mu).
	runCtx context.Context

	mu sync.Mutex
	// job is the bookkeeping; procs the pods' processes.
	job   *Job
	procs map[string]*podProc
	// tf decides a TF job's relaunches (nil: the master does).
	tf *tfOwner
	// The master, while it serves.
	server *master.Server
	addr   string
	mstop  context.CancelFunc
	mdone  chan error
}

// Run runs the job until every pod ended (or ctx ends: every process it
// started is stopped) and reads the root cause.
func Run(ctx context.Context, opts Options) (*Result, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, procs: map[string]*podProc{}, wake: make(chan struct{}, 1)}
	return e.run(ctx)
}

func (e *Engine) run(ctx context.Context) (*Result, error) {
	o := &e.opts
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return nil, err
	}
	o.Out = out
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	e.jobMark = hex.EncodeToString(b)
	e.token = hex.EncodeToString(b) + "-token"
	if e.tokenPath, err = claimOut(out, e.token); err != nil {
		return nil, err
	}
	for _, d := range []string{"errors", "state", "pods"} {
		if err := os.MkdirAll(filepath.Join(out, d), 0o755); err != nil {
			return nil, err
		}
	}
	logf, err := os.OpenFile(filepath.Join(out, "master.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	e.mlog = slog.New(slog.NewTextHandler(logf, nil))
	e.log = e.mlog.With("component", "local")
	e.view = newView(o.View, o.Live)
	defer e.view.close()
	e.errURL = "file://" + filepath.Join(out, "errors")
	e.limits = NewLimits("kfelastic-" + o.Job + "-" + e.jobMark)
	defer e.limits.Remove()
	e.note("limits", "memory and CPU limits: %s%s", e.limits.Mode, limitsNote(e.limits.Mode))
	if err := e.setupNetwork(); err != nil {
		return nil, err
	}
	if e.net != nil {
		defer e.net.close()
	}
	e.job = NewJob(JobConfig{Job: o.Job, MinNodes: o.MinNodes, MaxNodes: o.MaxNodes, Slots: o.Slots, Memory: o.Memory, TF: o.TF,
		Chaos: o.Chaos, OOM: e.relaunchPolicy().OOM, Limits: e.limits.Mode})
	if o.TF != nil {
		addrs, err := freeLoopbackPorts(o.TF.Replicas())
		if err != nil {
			return nil, err
		}
		e.tf = newTFOwner(*o.TF, addrs, e.relaunchPolicy())
	}

	mctx, cancelMaster := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelMaster()
	e.mctx = mctx
	if e.tf == nil { // TF replicas find each other by TF_CONFIG, not the master
		if err := e.startMaster(mctx); err != nil {
			return nil, err
		}
		e.note("master", "master serving on %s (state %s, documents %s)", e.addr, filepath.Join(out, "state"), e.errURL)
	}

	e.runCtx = ctx
	e.update(func(j *Job) { j.Begin(time.Now()) })
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	chaosDue := time.NewTimer(time.Hour)
	defer chaosDue.Stop()
	interrupted := false
	for !interrupted && !e.done(mctx) {
		var due <-chan time.Time
		e.mu.Lock()
		next := e.job.Deadline()
		e.mu.Unlock()
		if !next.IsZero() {
			chaosDue.Reset(time.Until(next))
			due = chaosDue.C
		}
		select {
		case <-ctx.Done():
			interrupted = true
		case <-e.wake:
		case <-due:
			e.update(func(j *Job) { j.Tick(time.Now()) })
		case <-tick.C:
			e.refresh()
		}
	}
	// A job interrupted while it started its pods may have none left.
	interrupted = interrupted || ctx.Err() != nil
	e.update(func(j *Job) { j.Finish() })
	if interrupted {
		e.note("stop", "interrupted: stopping every pod")
		e.stopAll(syscall.SIGINT)
	}
	e.stopMaster()
	res := e.result()
	if interrupted {
		return res, context.Cause(ctx)
	}
	return res, nil
}

// update feeds the Job an event and carries out what it asks.
func (e *Engine) update(event func(j *Job)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	event(e.job)
	e.carryOut()
}

// carryOut does what the Job asks (with e.mu held): lines, then pods to
// start (which the Job hears of at once), then the rest beside.
func (e *Engine) carryOut() {
	for r := e.job.Ready(); !r.empty(); r = e.job.Ready() {
		for _, n := range r.Notes {
			e.note(n.Kind, "%s", n.Text)
		}
		notStarted := 0
		for _, p := range r.Start {
			if e.runCtx.Err() != nil {
				e.job.NotStarted(p.Name)
				notStarted++
				continue
			}
			if pid, err := e.start(p); err != nil {
				e.job.StartFailed(p.Name, err)
			} else {
				e.job.Started(p.Name, pid, time.Now())
			}
		}
		if notStarted > 0 {
			e.note("stop", "interrupted: %d pods not started", notStarted)
		}
		for _, in := range r.Inject {
			if p := e.procs[in.Pod]; p != nil {
				go e.apply(in.Chaos, p)
			}
		}
		for _, pod := range r.FailOnJoin {
			if p := e.procs[pod]; p != nil {
				go e.failOnJoin(p)
			}
		}
		for _, s := range r.Supersede {
			go e.supersede(s.Old, s.By, s.Before)
		}
		for _, rp := range r.Reap {
			if p := e.procs[rp.Pod]; p != nil {
				go e.reap(p, rp)
			}
		}
		if r.RestartMaster {
			go e.restartMaster(e.mctx)
		}
	}
	e.signal()
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func limitsNote(mode string) string {
	switch mode {
	case "cgroup v1":
		return " (memory.limit_in_bytes; an OOM kill in a pod kills the whole pod, as Kubernetes' memory.oom.group does on v2)"
	case "rlimit":
		return " (no writable cgroup here: memory is an address-space limit per process, so oom fails an allocation instead of killing the pod, and straggler pauses the pod in bursts instead of throttling it)"
	}
	return " (memory.max with memory.oom.group, cpu.max)"
}

// ---- master ----

func (e *Engine) startMaster(ctx context.Context) error {
	o := &e.opts
	cfg := master.Config{JobID: o.Job, MinNodes: o.MinNodes, MaxNodes: o.MaxNodes, WaitingTimeout: o.WaitingTimeout,
		HeartbeatTimeout: o.HeartbeatTimeout, NetworkCheck: o.NetworkCheck, ExcludeStraggler: o.ExcludeStraggler,
		CheckTimeout: o.CheckTimeout, Relaunch: e.relaunchPolicy()}
	s, err := master.NewServer(ctx, master.Options{Job: cfg, Token: e.token, StateURL: "file://" + filepath.Join(o.Out, "state"),
		HeartbeatInterval: o.HeartbeatInterval, Owner: e, EventsURL: e.errURL, Logger: e.mlog.With("component", "master"),
		OnRound: e.round})
	if err != nil {
		return err
	}
	addr := e.addr
	switch {
	case addr != "":
	case e.net != nil:
		addr = e.net.gateway() + ":0"
	default:
		addr = "127.0.0.1:0"
	}
	var lis net.Listener
	for attempt := 0; ; attempt++ {
		if lis, err = net.Listen("tcp", addr); err == nil || attempt == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond) // the old master's port, a moment after it closed
	}
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Serve(sctx, lis) }()
	e.mu.Lock()
	e.server, e.addr, e.mstop, e.mdone = s, lis.Addr().String(), stop, done
	e.mu.Unlock()
	return nil
}

func (e *Engine) stopMaster() {
	e.mu.Lock()
	stop, done := e.mstop, e.mdone
	e.server = nil
	e.mu.Unlock()
	if stop != nil {
		stop()
		if err := <-done; err != nil {
			e.log.Warn("master ended with an error", "err", err)
		}
	}
}

// masterDown is how long kill-master keeps the master away: about what a
// master pod's restart takes, long enough for the agents to notice.
const masterDown = 2 * time.Second

// restartMaster is kill-master: the master stops and a new one starts on
// the same address with the same state.
func (e *Engine) restartMaster(ctx context.Context) {
	start := time.Now()
	e.stopMaster()
	e.note("chaos", "kill-master: master stopped; it restarts with its state in %s", masterDown)
	time.Sleep(masterDown)
	if err := e.startMaster(ctx); err != nil {
		e.note("chaos", "kill-master: the master did not come back: %v", err)
		return
	}
	e.note("chaos", "kill-master: master back on %s after %s", e.addr, time.Since(start).Round(time.Millisecond))
}

func (e *Engine) masterServer() *master.Server {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.server
}

// Carry is the master's decision, carried out as the training operator
// would (Job.Carry).
func (e *Engine) Carry(_ context.Context, d master.Decision) error {
	e.update(func(j *Job) { j.Carry(d, time.Now()) })
	return nil
}

// round is a round the master completed (master.Options.OnRound).
func (e *Engine) round(r master.CompletedRound) {
	e.update(func(j *Job) { j.Round(r) })
}

// relaunchPolicy is the job's relaunch policy: the master's, and a TF job's.
func (e *Engine) relaunchPolicy() relaunch.Policy {
	return relaunch.Policy{MaxPerRank: e.opts.MaxRelaunches, OOM: relaunch.DefaultOOM}
}

// ---- the end ----

// done reports whether the job is over: no pod pending or running, and
// every relaunch the master decided carried out.
func (e *Engine) done(ctx context.Context) bool {
	e.mu.Lock()
	done := e.job.Done()
	e.mu.Unlock()
	if !done {
		return false
	}
	// A decision may be on its way from the master's owner queue: take
	// them from the source.
	if s := e.masterServer(); s != nil {
		st, err := s.Status(ctx)
		if err != nil {
			return false
		}
		for _, d := range st.GetDecisions() {
			e.update(func(j *Job) { j.Carry(master.DecisionFrom(d), time.Now()) })
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.job.Done()
}

// refresh updates the view.
func (e *Engine) refresh() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.view.table(e.job.rows(), e.job.LatestRound(), e.job.MaxStep())
}

func (e *Engine) result() *Result {
	e.mu.Lock()
	o := e.job.Outcome()
	e.mu.Unlock()
	res := &Result{Succeeded: o.Succeeded, Documents: e.errURL, Pods: o.Pods, Stopped: o.Stopped, Recovery: o.Recovery}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, e.errURL, false)
	if err != nil {
		e.log.Warn("cannot read the documents", "err", err)
		return res
	}
	defer b.Close()
	sum, err := outputreader.Summarize(ctx, outputreader.NewBucketSource(b), nil)
	if err != nil {
		e.log.Warn("cannot read the documents", "err", err)
		return res
	}
	var missing []kferrors.Failure
	for _, f := range o.Unwritten {
		if !sum.HasPod(f.Worker) {
			missing = append(missing, f)
		}
	}
	sum = sum.Merge(missing...)
	if sum.RootCause != nil {
		res.Message, res.Recoverable = sum.Message(), sum.IsRecoverable()
	}
	return res
}
