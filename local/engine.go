package local

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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
}

func (o *Options) defaults() error {
	if o.Job == "" {
		o.Job = "local"
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
	// ranks' last pods finished their training.
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
// cgroup where there are cgroups). It is the master's PodOwner: it carries
// out relaunch decisions as the training operator would, and reports pods
// that die without their agent saying so.
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
	policy    relaunch.OOM

	mu      sync.Mutex
	server  *master.Server
	addr    string
	mstop   context.CancelFunc
	mdone   chan error
	book    pods
	tf      *tfJob // a TF PS job's replicas (nil: an elastic job)
	procs   map[string]*podProc
	carried map[int64]bool
	onExit  map[string]master.Decision
	fired   []bool
	maxStep int64
	failing map[int]bool // fail-pod ranks: their relaunches fail too
	// recovered are pods whose replacement joined a round: their failure
	// is recovered from.
	recovered map[string]bool
	later     map[int][]Chaos // chaos for a rank whose pod is not running yet
	extras    []kferrors.Failure
	stopped   string
	finished  bool
	// faults are the times the chaos actions fired; recoveredAt[i] the
	// first step after a round that formed after faults[i] (zero: none
	// yet); lastRound when a pod last printed a completed rendezvous.
	faults, recoveredAt []time.Time
	lastRound           time.Time
	wake                chan struct{}
	started             time.Time
	mctx                context.Context
}

// podProc is one pod's agent process.
type podProc struct {
	pod  Pod
	cmd  *exec.Cmd
	cg   *Cgroup
	done chan struct{}
	// cause is what the engine did to the pod (its failure when it dies
	// of it): a Failure code, "" if nothing.
	cause string
	// Parsed from the agent's output.
	step, restartCount, groupWorldSize int64
	round                              bool
	exit                               string
}

// Run runs the job until every pod ended (or ctx ends: every process it
// started is stopped) and reads the root cause.
func Run(ctx context.Context, opts Options) (*Result, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, procs: map[string]*podProc{}, carried: map[int64]bool{}, onExit: map[string]master.Decision{},
		failing: map[int]bool{}, recovered: map[string]bool{}, later: map[int][]Chaos{}, fired: make([]bool, len(opts.Chaos)), wake: make(chan struct{}, 1),
		policy: relaunch.DefaultOOM}
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
	e.book = NewBook(o.Job, o.MaxNodes, o.Slots, o.Memory)
	if o.TF != nil {
		if e.tf, err = newTFJob(*o.TF); err != nil {
			return nil, err
		}
		e.book = NewTFBook(o.Job, *o.TF, o.Memory)
	}

	e.started = time.Now()

	mctx, cancelMaster := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelMaster()
	e.mctx = mctx
	if e.tf == nil { // TF replicas find each other by TF_CONFIG, not the master
		if err := e.startMaster(mctx); err != nil {
			return nil, err
		}
		e.note("master", "master serving on %s (state %s, documents %s)", e.addr, filepath.Join(out, "state"), e.errURL)
	}

	e.mu.Lock()
	for i, c := range o.Chaos {
		if c.Step == 0 {
			i, c := i, c
			time.AfterFunc(c.After, func() { e.fire(i) })
		}
	}
	e.schedule()
	e.mu.Unlock()

	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	interrupted := false
	for !e.done(mctx) {
		select {
		case <-ctx.Done():
			interrupted = true
		case <-e.wake:
		case <-tick.C:
			e.refresh(mctx)
		}
		if interrupted {
			break
		}
	}
	e.mu.Lock()
	e.finished = true
	e.mu.Unlock()
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
		HeartbeatInterval: o.HeartbeatInterval, Owner: e, EventsURL: e.errURL, Logger: e.mlog.With("component", "master")})
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
// would: a relaunch gets a new pod with the next index and the same rank
// (twice the memory after an OOM kill); a stop drops the pods not started.
// Decisions carried again (after a master restart) are recognised by seq.
func (e *Engine) Carry(_ context.Context, d master.Decision) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.carry(d)
	return nil
}

func (e *Engine) carry(d master.Decision) {
	if e.carried[d.Seq] || e.finished {
		return
	}
	e.carried[d.Seq] = true
	switch d.Kind {
	case master.StopJob:
		e.stopped = d.Message
		for _, p := range e.book.Pods() {
			if p.State == Pending {
				e.book.Drop(p.Name)
			}
		}
		e.note("master", "the master stopped the job: %s", d.Message)
	case relaunch.None:
		e.note("master", "%s (rank %d) is not relaunched after %s: %s", d.Pod, d.Rank, d.Reason, shortMessage(d.Message))
	default:
		if p := e.procs[d.Pod]; p != nil && p.pod.State == Running {
			// Its agent has not exited yet (it is leaving, or it is lost):
			// the replacement starts once it is gone.
			e.onExit[d.Pod] = d
			go e.reap(p, d)
			return
		}
		e.relaunch(d)
	}
	e.signal()
}

// reap kills a pod the master gave up on if it has not exited by itself
// within the grace (a pod lost to the network, a frozen one).
func (e *Engine) reap(p *podProc, d master.Decision) {
	select {
	case <-p.done:
	case <-time.After(e.opts.Grace):
		e.note("pod", "%s still runs after the master's %s decision; killing it", p.pod.Name, master.KindName(d.Kind))
		e.killPod(p, "")
	}
}

func (e *Engine) relaunch(d master.Decision) {
	old := e.book.Current(d.Rank)
	mem := int64(0)
	if old != nil {
		mem = old.Memory
	}
	note := ""
	if d.Kind == relaunch.MoreMemory {
		if next, ok := e.policy.Raised(mem); ok {
			note = fmt.Sprintf(", memory %s → %s (%s)", bytesText(mem), bytesText(next), e.limits.Mode)
			mem = next
		}
	}
	p := e.book.Relaunch(d.Rank, mem)
	counted := "not counted"
	if d.Counted {
		counted = "counted"
	}
	e.note("relaunch", "%s replaces %s as rank %d after %s (%s, %s%s)", p.Name, d.Pod, d.Rank, d.Reason, master.KindName(d.Kind), counted, note)
	e.schedule()
}

// shortMessage is a message's first clause and last line (a traceback's
// exception), for one line of the view.
func shortMessage(m string) string {
	lines := strings.Split(strings.TrimSpace(m), "\n")
	first, last := lines[0], strings.TrimSpace(lines[len(lines)-1])
	if len(lines) > 1 {
		if head, _, ok := strings.Cut(first, "; "); ok {
			first = head
		}
		first += "; … " + last
	}
	if r := []rune(first); len(r) > 240 {
		first = string(r[:240]) + "…"
	}
	return first
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

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// ---- pods ----

// schedule starts the pods that have a slot (with e.mu held).
func (e *Engine) schedule() {
	if e.finished || e.stopped != "" {
		return
	}
	for _, p := range e.book.Schedule() {
		if err := e.start(*p); err != nil {
			e.note("pod", "%s cannot start: %v", p.Name, err)
			e.book.Exited(p.Name)
		}
	}
}

// start runs a pod's agent (with e.mu held).
func (e *Engine) start(p Pod) error {
	o := &e.opts
	cg, err := e.limits.Pod(e.cgroupName(p), p.Memory)
	if err != nil {
		return fmt.Errorf("its cgroup: %w", err)
	}
	logDir := filepath.Join(o.Out, "pods", p.Name)
	args := []string{"agent", "--nnodes", fmt.Sprintf("%d:%d", o.MinNodes, o.MaxNodes), "--nproc-per-node", strconv.Itoa(o.NProcPerNode),
		"--max-restarts", strconv.Itoa(o.MaxRestarts), "--rdzv-backend", "kfelastic", "--rdzv-endpoint", e.addr, "--rdzv-id", o.Job,
		"--token-file", e.tokenPath, "--node-rank", strconv.Itoa(p.Rank), "--error-prefix", e.errURL, "--log-dir", logDir,
		"--launcher", o.Launcher, "--stop-grace", o.Grace.String()}
	var prefix []string
	if e.net != nil {
		var addr string
		if prefix, addr, err = e.net.pod(p.Index); err != nil {
			return fmt.Errorf("its network namespace: %w", err)
		}
		// The pod's own address for its store, and gloo's interface.
		args = append(args, "--master-addr", addr)
	}
	args = append(args, o.AgentArgs...)
	args = append(args, "--")
	args = append(args, o.Command...)
	var podEnv []string
	if e.tf != nil {
		if args, podEnv, err = e.tfPod(p, logDir); err != nil {
			return err
		}
	}
	// A shell joins the pod's cgroups (or sets its address-space limit)
	// and execs the agent, so that no process of the pod ever runs outside.
	script := `for f in $KFELASTIC_LOCAL_CGROUPS; do echo $$ > "$f" || exit 111; done
[ -z "$KFELASTIC_LOCAL_RLIMIT_KB" ] || ulimit -v "$KFELASTIC_LOCAL_RLIMIT_KB" || exit 111
exec "$@"`
	argv := append([]string{"-c", script, "sh"}, prefix...)
	cmd := exec.Command("/bin/sh", append(append(argv, o.Binary), args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(append(os.Environ(), o.Env...), podEnv...)
	cmd.Env = append(cmd.Env, "POD_NAME="+p.Name, "HOSTNAME="+p.Name,
		// What the plugin injects into every replica (kfoperator's
		// addErrorPropagationEnv): flytekit in the pod writes its own
		// error-<uuid>.pb naming the pod.
		"_F_WN="+p.Name, "_F_DES=Earliest",
		// Each pod is its own machine: a relaunch "elsewhere" is another name.
		"KFELASTIC_NODE_NAME="+fmt.Sprintf("%s-node-%d", o.Job, p.Index),
		"KFELASTIC_LOCAL_JOB="+e.jobMark, "KFELASTIC_LOCAL_CGROUPS="+strings.Join(cg.ProcsFiles(), " "))
	if e.net != nil {
		cmd.Env = append(cmd.Env, "GLOO_SOCKET_IFNAME=eth0")
	}
	if e.limits.Mode == "rlimit" && p.Memory > 0 {
		cmd.Env = append(cmd.Env, "KFELASTIC_LOCAL_RLIMIT_KB="+strconv.FormatInt(p.Memory>>10, 10))
	}
	logFile, err := os.OpenFile(filepath.Join(o.Out, "pods", p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		logFile.Close()
		return err
	}
	pw.Close()
	pp := &podProc{pod: p, cmd: cmd, cg: cg, done: make(chan struct{})}
	e.procs[p.Name] = pp
	mem := ""
	if p.Memory > 0 {
		mem = ", memory " + bytesText(p.Memory)
	}
	e.note("pod", "%s started: rank %d, pid %d%s", p.Name, p.Rank, cmd.Process.Pid, mem)
	output := make(chan struct{})
	go func() {
		defer close(output)
		e.follow(pp, pr, logFile)
	}()
	go func() {
		<-output // the agent's last words are in before its exit is handled
		err := cmd.Wait()
		e.exited(pp, err)
	}()
	if e.limits.Mode == "cgroup v1" && p.Memory > 0 {
		go e.watchOOM(pp)
	}
	for _, c := range e.later[p.Rank] {
		go e.apply(c, pp)
	}
	delete(e.later, p.Rank)
	if e.failing[p.Rank] {
		go e.failOnJoin(pp)
	}
	return nil
}

var (
	stepRE  = regexp.MustCompile(`\bstep(?:\s*=\s*|\s+)(\d+)`)
	blockRE = regexp.MustCompile(`^\s*(restart_count|group_world_size)=(\d+)`)
	// commandRoundRE is a round under --launcher command, where the agent
	// prints no Rendezvous complete block (torch's agent inside the
	// command logs its own at INFO, which elastic_launch does not show):
	// the agent's log line for a master round that starts or keeps its
	// command. torch's own round follows through the master's store.
	commandRoundRE = regexp.MustCompile(`msg="(?:command started|the master completed a round[^"]*)".*\bgroup_world_size=(\d+)`)
)

// follow copies a pod's output to its log and reads what the view and the
// chaos triggers need: steps, and the Rendezvous complete block.
func (e *Engine) follow(p *podProc, r io.ReadCloser, logFile *os.File) {
	defer r.Close()
	defer logFile.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		_, _ = logFile.WriteString(line + "\n")
		if m := blockRE.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseInt(m[2], 10, 64)
			e.mu.Lock()
			if m[1] == "restart_count" {
				p.restartCount = n
			} else {
				e.roundSeen(p, n, fmt.Sprintf("Rendezvous complete: group_world_size=%d restart_count=%d", n, p.restartCount))
			}
			e.mu.Unlock()
			continue
		}
		if m := commandRoundRE.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			e.mu.Lock()
			e.roundSeen(p, n, fmt.Sprintf("a master round: group_world_size=%d (torch's own rendezvous runs in the command, through the master's store)", n))
			e.mu.Unlock()
		}
		if strings.Contains(line, "Rendezvous complete") || strings.Contains(line, "level=") {
			continue // the agent's own log, not a worker's step
		}
		if m := stepRE.FindStringSubmatch(line); m != nil {
			n, err := strconv.ParseInt(m[1], 10, 64)
			if err == nil {
				e.stepSeen(p, n)
			}
		}
	}
}

// roundSeen notes a round p joined (with e.mu held); a replacement's first
// recovers the pod it replaces.
func (e *Engine) roundSeen(p *podProc, size int64, what string) {
	p.groupWorldSize, p.round = size, true
	e.lastRound = time.Now()
	e.note("round", "%s: %s", p.pod.Name, what)
	if old := p.pod.Replaces; old != "" && !e.recovered[old] {
		e.recovered[old] = true
		go e.supersede(old, p.pod.Name, time.Now())
	}
}

func (e *Engine) stepSeen(p *podProc, n int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p.step = n
	now := time.Now()
	for i, at := range e.faults {
		if e.recoveredAt[i].IsZero() && e.lastRound.After(at) {
			e.recoveredAt[i] = now
		}
	}
	if n <= e.maxStep {
		return
	}
	e.maxStep = n
	for i, c := range e.opts.Chaos {
		if c.Step > 0 && c.Step <= n && !e.fired[i] {
			go e.fire(i)
		}
	}
}

// exited handles an agent's end: the book, the master (a pod that died
// without its agent saying so), and a relaunch waiting for it.
func (e *Engine) exited(p *podProc, werr error) {
	now := time.Now()
	close(p.done)
	ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	// Whatever the agent left behind (its guardian kills its workers; a
	// SIGKILLed pod may leave a helper): the pod is gone as a whole.
	killAll(append(descendants(p.cmd.Process.Pid), p.cg.Procs()...), syscall.SIGKILL)
	oom := p.cg.OOMKills() > 0
	e.mu.Lock()
	cause := p.cause
	e.book.Exited(p.pod.Name)
	e.procs[p.pod.Name].pod.State = Exited
	e.mu.Unlock()
	var f *kferrors.Failure
	var exit string
	switch {
	case werr == nil:
		exit = "succeeded"
	case oom || cause == kferrors.CodeOOMKilled:
		x := kferrors.SystemFailure(kferrors.CodeOOMKilled, fmt.Sprintf("pod %s was OOMKilled: it went past its memory limit of %s", p.pod.Name, bytesText(p.pod.Memory)), p.pod.Name, now)
		f = &x
	case cause == kferrors.CodeNodeLost:
		x := kferrors.SystemFailure(kferrors.CodeNodeLost, fmt.Sprintf("pod %s failed: its machine is gone", p.pod.Name), p.pod.Name, now)
		f = &x
	case ws.Signaled():
		code := kferrors.SignalCode(ws.Signal())
		if cause == kferrors.CodePreempted {
			code = kferrors.CodePreempted
		}
		x := kferrors.SystemFailure(code, fmt.Sprintf("pod %s was killed by %s", p.pod.Name, kferrors.SignalName(ws.Signal())), p.pod.Name, now)
		f = &x
	default:
		exit = exitText(ws.ExitStatus())
	}
	if e.tf != nil {
		f = e.tfExited(p, f, werr)
	}
	if f != nil {
		exit = f.Code
	}
	e.mu.Lock()
	p.exit = exit
	e.mu.Unlock()
	if f != nil {
		e.document(*f)
		if e.tf == nil {
			e.podGone(p.pod.Name, *f)
		}
	}
	e.note("pod", "%s exited: %s", p.pod.Name, exit)
	go func() {
		for range 50 {
			if os.Remove(p.cg.mem) == nil || p.cg.mem == "" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		p.cg.Remove()
	}()
	e.mu.Lock()
	if d, ok := e.onExit[p.pod.Name]; ok {
		delete(e.onExit, p.pod.Name)
		e.relaunch(d)
	}
	e.schedule()
	e.mu.Unlock()
	e.signal()
}

// supersede moves the documents of a pod that was replaced, dated before
// its replacement joined a round, out of the reader's way, as its agent
// does for the failures it restarted from (kferrors.Supersede): the
// replacement's round is their recovery. On Kubernetes the training
// operator recreates a pod under its own name and the new agent does this;
// here the replacement has the next index, so its owner does it.
func (e *Engine) supersede(old, by string, before time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, e.errURL, true)
	if err != nil {
		e.log.Warn("cannot open the documents", "err", err)
		return
	}
	defer b.Close()
	// The old pod's agent may still be uploading: wait for its exit.
	e.mu.Lock()
	p := e.procs[old]
	e.mu.Unlock()
	if p != nil && old != by { // (a TF pod recreated under its name: the old one is gone)
		<-p.done
	}
	moved, err := kferrors.Supersede(ctx, b, old, before)
	if err != nil {
		e.log.Warn("cannot supersede a replaced pod's documents", "pod", old, "err", err)
	}
	if len(moved) > 0 {
		e.note("recovered", "%s's failure is recovered (%s trains in its place): its documents moved to %s", old, by, kferrors.SupersededPrefix)
	}
}

// document writes the document of a pod that died without writing one (its
// agent was killed with it): what the plugin synthesizes from the pod's
// status on Kubernetes (OOMKilled, a lost node), written here so that the
// report draws it and a recovery supersedes it like any other. A document
// that cannot be written is kept for the root cause all the same.
func (e *Engine) document(f kferrors.Failure) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, e.errURL, true)
	if err == nil {
		_, err = kferrors.NewWriter(b, nil).Write(ctx, f)
		b.Close()
	}
	if err != nil {
		e.log.Warn("cannot write a dead pod's document", "pod", f.Worker, "err", err)
		e.mu.Lock()
		e.extras = append(e.extras, f)
		e.mu.Unlock()
	}
}

// podGone tells the master, retried while it restarts.
func (e *Engine) podGone(pod string, f kferrors.Failure) {
	for range 100 {
		s := e.masterServer()
		if s != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := s.PodGone(ctx, pod, f)
			cancel()
			if err == nil {
				return
			}
		}
		e.mu.Lock()
		fin := e.finished
		e.mu.Unlock()
		if fin {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
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

// killPod kills every process of the pod at once (a machine that dies);
// cause is the failure the engine reports for it ("" keeps what it had).
func (e *Engine) killPod(p *podProc, cause string) {
	e.mu.Lock()
	if cause != "" {
		p.cause = cause
	}
	e.mu.Unlock()
	pid := p.cmd.Process.Pid
	for range 3 { // SIGKILL stops nothing from forking in between: twice more
		killAll(append(descendants(pid), p.cg.Procs()...), syscall.SIGKILL)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// deletePod is Kubernetes' pod deletion: SIGTERM to the pod's main
// process, then SIGKILL to everything after the grace.
func (e *Engine) deletePod(p *podProc, sig syscall.Signal, cause string) {
	e.mu.Lock()
	if cause != "" {
		p.cause = cause
	}
	e.mu.Unlock()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(e.opts.Grace + time.Second):
		e.killPod(p, "")
	}
}

// stopAll stops every running pod with sig, grace, SIGKILL, and waits.
func (e *Engine) stopAll(sig syscall.Signal) {
	e.mu.Lock()
	var ps []*podProc
	for _, p := range e.procs {
		select {
		case <-p.done:
		default:
			ps = append(ps, p)
		}
	}
	e.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() {
			e.deletePod(p, sig, "")
			<-p.done
		})
	}
	wg.Wait()
}

// watchOOM is memory.oom.group for cgroup v1: when the kernel OOM-kills a
// process of the pod, the whole pod dies, as a Kubernetes container.
func (e *Engine) watchOOM(p *podProc) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			if p.cg.OOMKills() > 0 {
				e.note("pod", "%s: the kernel OOM-killed a process (limit %s): the pod is OOMKilled", p.pod.Name, bytesText(p.pod.Memory))
				e.killPod(p, kferrors.CodeOOMKilled)
				return
			}
		}
	}
}

// ---- the end ----

// done reports whether the job is over: no pod pending or running, and
// every relaunch the master decided carried out.
func (e *Engine) done(ctx context.Context) bool {
	e.mu.Lock()
	if !e.book.Done() || len(e.onExit) > 0 {
		e.mu.Unlock()
		return false
	}
	e.mu.Unlock()
	// A decision may be on its way from the master's owner queue: take
	// them from the source.
	if s := e.masterServer(); s != nil {
		st, err := s.Status(ctx)
		if err != nil {
			return false
		}
		e.mu.Lock()
		for _, d := range st.GetDecisions() {
			e.carry(master.DecisionFrom(d))
		}
		e.mu.Unlock()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.book.Done() && len(e.onExit) == 0
}

// refresh updates the view from the master's status.
func (e *Engine) refresh(ctx context.Context) {
	s := e.masterServer()
	var round int64
	if s != nil {
		if st, err := s.Status(ctx); err == nil {
			round = st.GetRound()
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.view.table(e.rows(), round, e.maxStep)
}

func (e *Engine) result() *Result {
	e.mu.Lock()
	res := &Result{Documents: e.errURL, Pods: e.book.Pods(), Stopped: e.stopped}
	for i, at := range e.faults {
		var d time.Duration
		if !e.recoveredAt[i].IsZero() {
			d = e.recoveredAt[i].Sub(at)
		}
		res.Recovery = append(res.Recovery, d)
	}
	extras := e.extras
	recovered := maps.Clone(e.recovered)
	finished := map[int]bool{}
	for _, p := range e.book.Pods() {
		if pp := e.procs[p.Name]; pp != nil && pp.exit == "succeeded" {
			finished[p.Rank] = true
		}
	}
	e.mu.Unlock()
	res.Succeeded = e.stopped == "" && len(finished) >= e.opts.MinNodes
	if e.tf != nil {
		res.Succeeded = e.tf.over // a TFJob succeeds with its chief
	}
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
	for _, f := range extras {
		if !sum.HasPod(f.Worker) && !recovered[f.Worker] {
			missing = append(missing, f)
		}
	}
	sum = sum.Merge(missing...)
	if sum.RootCause != nil {
		res.Message, res.Recoverable = sum.Message(), sum.IsRecoverable()
	}
	return res
}
