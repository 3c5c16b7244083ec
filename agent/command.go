package agent

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kfelastic/kfelastic/agent/guardian"
	"github.com/kfelastic/kfelastic/agent/storerelay"
	"github.com/kfelastic/kfelastic/agent/torchhook"
)

// --launcher command (docs/DESIGN.md §4.4).
//
// The agent starts exactly one child, the user's command (flytekit's
// pyflyte-execute, or any script that calls torch's elastic_launch or
// torchrun itself), which forks and restarts its own workers. How the agent's
// duties map onto it:
//
//   - Master rounds: the agent joins the master once before the child starts
//     (the node check runs then, as in agent mode) and starts the child with
//     the first round. A round that changes later (a node left, a replacement
//     waits, a scale-up) does not stop the child: torch's own agent inside it
//     re-rendezvouses through the store. The agent only re-joins the master
//     in the background (Policy, Command), so that the master's membership
//     follows and a replacement pod completes a round with the others. The
//     heartbeat's EXIT (an exclusion, a stopped job) stops the child.
//   - The store: the child's PET_RDZV_ENDPOINT is the agent's loopback
//     TCPStore relay, which carries torch's c10d rendezvous (and the rest of
//     its store operations) to the master, so the store survives the loss of
//     any pod, worker 0's included; with it, the child's PET_RDZV_BACKEND is
//     c10d and PET_RDZV_CONF has is_host=false (torchrun reads them; flytekit
//     hard-codes c10d). Without a master (one node, or the static
//     backend) there is no relay and PET_RDZV_ENDPOINT is left as it is:
//     torch hosts its store itself, as upstream.
//   - Restarts: --max-restarts is torch's business inside the child (it gets
//     PET_MAX_RESTARTS); the agent never restarts the child. The child's exit
//     status decides the pod's end: documents and exit codes as for a worker
//     (OOM, signal, exit code, torch's error file when the child writes one).
//     A failed child counts as OOM when the OOM killer struck in the pod's
//     memory cgroup during its life: it kills a worker, and torch's agent
//     then fails with whatever status it chooses.
//     flytekit writes its own documents (_F_WN, _F_DES), which the agent
//     leaves alone: the child gets the pod's environment, not a worker's.
//   - Signals: SIGTERM to the agent sends the dump signal to torch's
//     workers (commandWorkers: below launchers such as pyflyte-fast-execute,
//     never multiprocessing's resource tracker), not to the child, whose
//     default action would end torch's agent before any worker dumped
//     (flytekit's pyflyte-execute registers faulthandler on SIGUSR1: it
//     would only print tracebacks); then SIGTERM to the child's process
//     group, grace, SIGKILL. The hang watchdog's dump goes the same way.
//   - The hang watchdog watches the child's output (the workers inherit it)
//     and KFELASTIC_PROGRESS_FILE, which the workers inherit too.

// LauncherCommand is Config.Launcher for --launcher command.
const LauncherCommand = "command"

func (c *Config) command() bool { return c.Launcher == LauncherCommand }

// startCommandRelay starts the child's store relay (agent/storerelay) when
// the rendezvous is the master; nil (PET_RDZV_ENDPOINT unchanged) otherwise.
func startCommandRelay(ctx context.Context, rdzv Rendezvous, log *slog.Logger) (*storerelay.Relay, error) {
	m, ok := rdzv.(*Master)
	if !ok {
		return nil, nil
	}
	r, err := storerelay.Start(ctx, m.Client(), m.Incarnation(), log)
	if err != nil {
		return nil, err
	}
	r.OnRefused(m.StoreRefused)
	log.Info("store relay for the command", "addr", r.Addr())
	return r, nil
}

// commandGroups starts --launcher command's one child (the policy never
// restarts it), exec'd with the pod's environment and the store relay as
// PET_RDZV_ENDPOINT; torch's own agent in the child prints torchrun's
// rendezvous block for its workers. With the master, the relay lives as
// long as the agent, and forgets the c10d nodes that the master's rounds
// lost (roundCompleted).
type commandGroups struct {
	l *loop
	// relay is the store relay (nil without the master), relayAddr its
	// address, the child's PET_RDZV_ENDPOINT; outdatedAt is when the
	// master outdated the round the command runs in (zero: not since the
	// last round): c10d's dead nodes are forgotten from then on.
	relay      *storerelay.Relay
	relayAddr  string
	outdatedAt time.Time
	// hook is the folder of the command's torch hook (agent/torchhook); ""
	// when it could not be written.
	hook string
	// roundFile is where the master's current round is kept for the
	// torch hook (torchhook.Options.RoundFile); "" without the master.
	roundFile string
}

var _ groupStarter = (*commandGroups)(nil)

// newCommandGroups starts the child's store relay when the rendezvous is
// the master.
func newCommandGroups(l *loop) (*commandGroups, error) {
	c := &commandGroups{l: l}
	relay, err := startCommandRelay(l.work, l.cfg.Rendezvous, l.log)
	if err != nil {
		return nil, err
	}
	if relay != nil {
		c.relay, c.relayAddr = relay, relay.Addr()
		c.roundFile = filepath.Join(l.runDir, "master-round")
	}
	if c.hook, err = torchhook.Install(l.runDir); err != nil {
		// torch then starts and waits as it would: slower, not wrong.
		l.log.Warn("no torch hook for the command", "err", err)
		c.hook = ""
	}
	return c, nil
}

func (c *commandGroups) start(a StartGroup) (*group, []WorkerExited) {
	l, r := c.l, a.Round
	c.keepRound(r)
	gs := l.groupStart(1)
	gs.commandMode, gs.launcher = true, execLauncher{}
	spec := commandSpec{cfg: &l.cfg, rdzvEndpoint: c.relayAddr, loopback: c.relayAddr != "" && !hostnameResolves(), hook: c.hook,
		roundFile: c.roundFile}
	gs.env = func(w *worker, mark string) []string {
		s := spec
		s.errorFile, s.progressFile, s.mark = w.errorFile, w.progressFile, mark
		return CommandEnv(l.cfg.Env, s)
	}
	g, notStarted := startGroup(gs, a)
	l.log.Info("command started", "attempt", a.Attempt, "round", r.Number, "group_rank", r.GroupRank,
		"group_world_size", r.GroupWorldSize, "rdzv_endpoint", c.relayAddr, "dir", g.dir)
	return g, notStarted
}

func (c *commandGroups) roundOutdated(at time.Time) {
	if c.relay != nil {
		c.outdatedAt = at
	}
}

// roundCompleted: the command goes on in the master's new round; the relay
// forgets the c10d nodes that the master's round before lost.
func (c *commandGroups) roundCompleted(r Round) {
	c.l.log.Info("the master completed a round; the command goes on (torch re-rendezvouses through the store itself)",
		"round", r.Number, "group_rank", r.GroupRank, "group_world_size", r.GroupWorldSize)
	c.keepRound(r)
	if c.relay != nil && !c.outdatedAt.IsZero() && forgetsLost(r) {
		go c.forgetLost(c.outdatedAt, r.DepartedSince, r.GroupWorldSize, r.Departed)
	}
	c.outdatedAt = time.Time{}
}

// keepRound tells the command's torch hook the master's round: c10d's
// rendezvous there completes once it has that many nodes. Unwritten, c10d
// waits out its last call as it would without the hook: slower, not wrong.
func (c *commandGroups) keepRound(r Round) {
	if c.roundFile == "" || c.hook == "" {
		return
	}
	if err := torchhook.WriteRound(c.roundFile, int64(r.Number), r.GroupWorldSize); err != nil {
		c.l.log.Warn("cannot keep the master's round for the torch hook", "path", c.roundFile, "err", err)
	}
}

// stop closes the store relay.
func (c *commandGroups) stop() {
	if c.relay != nil {
		_ = c.relay.Close()
	}
}

// forgetsLost reports whether the relay has lost c10d nodes to forget
// after the master's round r: not when the master knows that every member
// of the round before is in r (a scale-up). Without the count the relay
// waits for the live nodes' heartbeats, and a slow newcomer's torch, still
// starting when that wait ran out (c10dKeepAliveGrace), had the relay age
// the heartbeats of the very nodes it was joining: they looked dead to
// torch, and the scale-up stopped there (TestCommandScaleUp on a loaded
// machine, 2026-12-07).
func forgetsLost(r Round) bool {
	return !(r.DepartedKnown && r.Departed == 0)
}

// forgetLostLimit bounds how long a relay watches torch's c10d state for
// its dead nodes after the master outdated a round: past keep_alive_interval
// × keep_alive_max_attempt (15 s by default) torch has forgotten them itself.
const forgetLostLimit = 20 * time.Second

// forgetLost has the relay age the heartbeats of the c10d nodes that were
// lost when the master outdated the command's round (Relay.ForgetLost): live
// nodes are in the master's new round, lost of the round before are not.
func (c *commandGroups) forgetLost(cutoff, since time.Time, live, lost int) {
	ctx, cancel := context.WithTimeout(c.l.work, forgetLostLimit)
	defer cancel()
	if n := c.relay.ForgetLost(ctx, storerelay.Cutoffs{Learnt: cutoff, Departed: since}, live, lost); n > 0 {
		c.l.log.Info("lost nodes forgotten in torch's c10d rendezvous", "nodes", n, "live", live,
			"lost", lost, "after", time.Since(cutoff).Round(time.Millisecond))
	}
}

// commandSpec is what the child's environment adds to the pod's.
type commandSpec struct {
	cfg *Config
	// rdzvEndpoint is the relay's address; "" leaves PET_RDZV_ENDPOINT.
	rdzvEndpoint string
	// loopback keeps the relay's loopback address as PET_RDZV_ENDPOINT
	// (relayEndpoint): this machine's name does not resolve.
	loopback     bool
	errorFile    string
	progressFile string
	mark         string
	// hook is the torch hook's folder (agent/torchhook); "" for none.
	hook string
	// roundFile is the master's round for the hook (commandGroups.keepRound).
	roundFile string
}

// CommandEnv is the child's environment under --launcher command: the pod's
// own (base), PET_* unchanged except PET_RDZV_ENDPOINT, which is the relay's
// port on 0.0.0.0 when there is one (relayEndpoint), with PET_RDZV_BACKEND=c10d and
// is_host=false in PET_RDZV_CONF (a client of the relay). The PET_* that torch's launch reads
// and the pod lacks (an agent given flags, not the operator's env) are set
// from the agent's flags, so that the command sees the same job. Added:
// TORCHELASTIC_ERROR_FILE (torch's @record in the child, as torchrun's main
// has it, copies the first failed worker's error there), the progress file
// and the agent's mark, PYTHONUNBUFFERED=1 when unset. No worker variable
// (RANK, MASTER_ADDR, …: torch's agent sets its workers' own), no _F_WN or
// _F_DES (the pod's, for flytekit's documents). The training operator's
// per-pod worker variables are dropped (operatorPodEnv). The torch hook
// (agent/torchhook) comes first on PYTHONPATH, with its variables.
func CommandEnv(base []string, s commandSpec) []string {
	env := envMap(base)
	c := s.cfg
	nnodes := strconv.Itoa(c.MinNodes)
	if c.MaxNodes != c.MinNodes {
		nnodes += ":" + strconv.Itoa(c.MaxNodes)
	}
	defaults := map[string]string{"PET_NNODES": nnodes, "PET_NPROC_PER_NODE": strconv.Itoa(c.NProcPerNode),
		"PET_MAX_RESTARTS": strconv.Itoa(c.MaxRestarts), "PET_RDZV_ID": c.RdzvID, "PYTHONUNBUFFERED": "1"}
	if c.RdzvEndpoint != "" && s.rdzvEndpoint == "" {
		defaults["PET_RDZV_ENDPOINT"] = c.RdzvEndpoint
	}
	for k, v := range defaults {
		if env[k] == "" {
			env[k] = v
		}
	}
	for _, k := range operatorPodEnv {
		delete(env, k)
	}
	if c.NodeRank >= 0 {
		env["PET_NODE_RANK"] = strconv.Itoa(c.NodeRank)
	}
	if s.rdzvEndpoint != "" {
		env["PET_RDZV_ENDPOINT"] = s.rdzvEndpoint
		if !s.loopback {
			env["PET_RDZV_ENDPOINT"] = relayEndpoint(s.rdzvEndpoint)
		}
		// The relay speaks TCPStore, which only torch's c10d backend uses
		// as a client: torchrun's default (static, the training operator
		// sets PET_RDZV_BACKEND only for elastic jobs) has node 0 host its
		// store on the endpoint, which fails on the relay's port ("Address
		// already in use") with no fallback, and the other nodes wait for
		// it until their join timeout. The agent's own backend name
		// (kfelastic) is no torch backend either.
		env["PET_RDZV_BACKEND"] = "c10d"
		env["PET_RDZV_CONF"] = clientOnly(env["PET_RDZV_CONF"])
		// torch 2.5+'s rank-0 torch agent hosts a store of its own for the
		// workers and the others keep its address across rounds (2.14's
		// next_rendezvous builds it once per node): when rank 0's pod is
		// replaced, a new rank 0 waits for a MASTER_ADDR nobody publishes,
		// or the others meet a dead store, for the store's 60 s timeout
		// (scenario 11 failed so). Without the sharing the workers' store
		// is rebuilt every round, as on 1.13: torch's own opt-out, unless
		// the pod sets it.
		if _, ok := env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]; !ok {
			env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
		}
	}
	hook := torchhook.Options{DrainErrors: true}
	if !c.NoForkServer && !c.WarmSpares {
		hook.Preload = c.preload()
	}
	if s.rdzvEndpoint != "" {
		hook.Poll, hook.RoundFile = rdzvPoll, s.roundFile
	}
	torchhook.Env(env, s.hook, hook)
	env["TORCHELASTIC_ERROR_FILE"] = s.errorFile
	env[ProgressFileEnv] = s.progressFile
	if s.mark != "" {
		env[guardian.MarkEnv] = s.mark
	}
	return envList(env)
}

// rdzvPoll is how often (seconds) c10d's rendezvous in the command reads
// its state from the relay while it waits: a tenth of torch's second, a
// read of the master's store per node each time.
const rdzvPoll = "0.1"

// relayEndpoint is the relay's loopback address as the command's
// PET_RDZV_ENDPOINT: 0.0.0.0:<port>. flytekit passes PET_RDZV_ENDPOINT to
// elastic_launch with its own rdzv_configs, so the is_host=false in
// PET_RDZV_CONF never reaches torch; c10d then decides whether to host the
// store from the endpoint's host (torch's _matches_machine_hostname:
// "localhost", a loopback address, this machine's name or one of its
// addresses), tries to host it on the relay's port first, and every pod
// logs "The server socket has failed to listen on any local network
// address" at ERROR before it connects as a client. 0.0.0.0 is none of
// those, so torch is a client at once; Linux connects 0.0.0.0 to the local
// host, where the relay listens on 127.0.0.1 only. To compare 0.0.0.0 with
// this machine's addresses torch resolves this machine's name, and fails
// the rendezvous if it cannot (a pod's name is always in its /etc/hosts):
// where it does not resolve (hostnameResolves) the loopback address stays,
// and torch logs the failed bind and connects.
func relayEndpoint(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort("0.0.0.0", port)
}

// hostnameResolves reports whether this machine's name resolves, as torch's
// c10d needs for a rendezvous endpoint that is not loopback.
func hostnameResolves() bool {
	name, err := os.Hostname()
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	return err == nil && len(addrs) > 0
}

// operatorPodEnv is what the training operator sets on a pod for a worker
// of a static job: RANK = PET_NODE_RANK = the replica index (+1 with a
// Master replica), WORLD_SIZE counting the Master, MASTER_ADDR/PORT and
// PET_MASTER_ADDR/PORT naming the Master replica, which in an elastic job
// is the kfelastic master, no torch store. None of it is the elastic job's:
// torch's launch in the command sets its workers' own, and a static
// rendezvous must never be pointed at the master. PET_NODE_RANK is
// replaced by the agent's node rank.
var operatorPodEnv = []string{"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NODE_RANK"}

// clientOnly is torchrun's --rdzv-conf with is_host=false: c10d's guess
// (the endpoint's host is this machine's, as loopback always is) would try
// to host the store on the relay's port first, log the failed bind as an
// error and only then connect as a client; an is_host=true given would fail
// for good.
func clientOnly(conf string) string {
	var kept []string
	for kv := range strings.SplitSeq(conf, ",") {
		k, _, _ := strings.Cut(kv, "=")
		if k = strings.TrimSpace(k); k != "" && k != "is_host" {
			kept = append(kept, kv)
		}
	}
	return strings.Join(append(kept, "is_host=false"), ",")
}

// childPIDs are the live children of pid (every thread's), from
// /proc/<pid>/task/*/children.
func childPIDs(pid int) []int {
	tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	var pids []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for f := range strings.FieldsSeq(string(b)) {
			if n, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, n) {
				pids = append(pids, n)
			}
		}
	}
	return pids
}

// signalWorkers sends sig to the command's workers (commandWorkers); it
// returns how many got it.
func signalWorkers(pid int, sig syscall.Signal) int {
	n := 0
	for _, c := range commandWorkers(pid) {
		if syscall.Kill(c, sig) == nil {
			n++
		}
	}
	return n
}

// commandWorkers are the command's workers, the processes torch's agent
// started, found below pid (the command): the children of the first
// process down the line that has workers. A child is a worker when spawn
// started it (multiprocessing's spawn_main: flytekit's default start
// method), when fork started it (the same command line as its parent), or
// when torch exec'd it (LOCAL_RANK in its environment: torchrun, a binary
// entrypoint); the children of multiprocessing's forkserver are workers
// (the torch hook's, agent/torchhook, where spawn was asked for: a fork of
// the command named torchhook.ServerComm). A single child that is none of these is a launcher in
// between (pyflyte-fast-execute runs pyflyte-execute as its child; a
// script may run torchrun), and the search goes on below it, four levels
// at most. multiprocessing's helpers (the resource tracker that runs
// beside spawned workers, the forkserver) are never workers: the dump
// signal's default action would kill the tracker, leaving the workers'
// semaphores and shared memory to leak.
func commandWorkers(pid int) []int {
	parent := pid
	for range 4 {
		var kids, forked []int
		for _, c := range childPIDs(parent) {
			switch cmd := procCmdline(c); {
			case forkServer(cmd) || procComm(c) == torchhook.ServerComm:
				// multiprocessing's forkserver (the spawn hook's, or the
				// command's own choice): its children are workers.
				forked = append(forked, childPIDs(c)...)
			case !multiprocessingHelper(cmd):
				kids = append(kids, c)
			}
		}
		if len(forked) > 0 {
			return append(kids, forked...)
		}
		if len(kids) != 1 || isWorker(parent, kids[0]) {
			return kids
		}
		parent = kids[0]
	}
	return nil
}

// forkServer reports whether a command line is multiprocessing's
// forkserver.
func forkServer(cmd string) bool { return strings.Contains(cmd, "multiprocessing.forkserver") }

func isWorker(parent, pid int) bool {
	cmd := procCmdline(pid)
	if strings.Contains(cmd, "multiprocessing.spawn") || cmd == procCmdline(parent) {
		return true
	}
	env, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	for kv := range strings.SplitSeq(string(env), "\x00") {
		if strings.HasPrefix(kv, "LOCAL_RANK=") {
			return true
		}
	}
	return false
}

// multiprocessingHelper reports whether a command line is one of Python
// multiprocessing's helper processes.
func multiprocessingHelper(cmd string) bool {
	return strings.Contains(cmd, "multiprocessing.resource_tracker") || forkServer(cmd) ||
		strings.Contains(cmd, "multiprocessing.semaphore_tracker")
}

// procComm is pid's name (/proc/PID/comm); "" if gone.
func procComm(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	return strings.TrimSpace(string(b))
}

// procCmdline is pid's command line, arguments joined by spaces; "" if gone.
func procCmdline(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}
