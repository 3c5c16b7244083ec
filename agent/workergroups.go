package agent

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kfelastic/kfelastic/agent/forkserver"
	"github.com/kfelastic/kfelastic/agent/guardian"
	"github.com/kfelastic/kfelastic/agent/storeproxy"
	"github.com/kfelastic/kfelastic/internal/termsafe"
)

// A groupStarter starts each attempt's group for the loop (docs/DESIGN.md
// §4.4): workerGroups, the agent's own workers as torchrun starts them
// (--launcher agent), or commandGroups, the one command that starts its own
// (--launcher command). It keeps what lives from one group to the next.
type groupStarter interface {
	// start starts attempt a's group in its round; the workers it could
	// not start come back as exits, for the loop to step.
	start(a StartGroup) (*group, []WorkerExited)
	// roundOutdated tells the starter that the loop joins a new round,
	// at, after a group's: the agent's workers have ended; --launcher
	// command's child runs on, in a round the master outdated.
	roundOutdated(at time.Time)
	// roundCompleted tells it that the master completed round r while the
	// group runs on (WatchRound: --launcher command only).
	roundCompleted(r Round)
	// stop ends what the starter keeps between groups; the loop's cleanup
	// calls it once.
	stop()
}

// workerGroups starts the agent's own workers as torchrun does: it prints
// torchrun's rendezvous block, puts the store proxy in front of rank 0's
// store on group rank 0's node (agent/storeproxy), and launches the
// workers by exec, from the fork server or from warm spares (launch.go),
// which it keeps between groups.
type workerGroups struct {
	l *loop
	// torchProbe brings the workers' torch version (torchVersion) once;
	// torchIs2 is what torch2 made of it.
	torchProbe chan string
	torchOnce  sync.Once
	torchIs2   bool
	// fork is the fork server, nil without one, and forkMark its mark;
	// forkStarts counts the servers started, for their marks and the
	// restart limit; forkWanted: the command can be forked and the fork
	// server is not turned off.
	fork       *forkserver.Server
	forkMark   string
	forkStarts int
	forkWanted bool
	// spares are the next attempt's warm spares by local rank (nil
	// without Config.WarmSpares, or before they start); spareFor is the
	// group whose workers must speak before they start, spareTimer the
	// fallback.
	spares     []*worker
	spareFor   *spareWait
	spareTimer *time.Timer
}

var _ groupStarter = (*workerGroups)(nil)

// torchProbeLimit bounds the torch version probe: an interpreter start,
// under load, without importing torch.
const torchProbeLimit = 30 * time.Second

// newWorkerGroups prepares the loop's worker groups and asks the workers'
// interpreter for its torch, which decides which of torchrun's variables
// they get (WorkerEnv), in the background while the agent meets the others.
func newWorkerGroups(l *loop) *workerGroups {
	cfg := l.cfg
	g := &workerGroups{l: l, torchProbe: make(chan string, 1),
		// The fork server starts with the first group (forkServer).
		forkWanted: cfg.launcher == nil && !cfg.NoForkServer && !cfg.WarmSpares && forkable(cfg.Command)}
	go func() { g.torchProbe <- torchVersion(l.work, cfg.Command, cfg.Env, torchProbeLimit) }()
	return g
}

// start prints torchrun's rendezvous block and starts the group's workers:
// the store proxy first, so that no worker of another node meets a refused
// MASTER_PORT while this node's start waits for its fork server.
func (g *workerGroups) start(a StartGroup) (*group, []WorkerExited) {
	l, r := g.l, a.Round
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
	server := g.forkServer()
	gs := l.groupStart(l.cfg.NProcPerNode)
	if l.cfg.WarmSpares {
		gs.spoke = func(w *worker) { l.call(func() { g.spoke(w) }) }
	}
	if l.group != nil {
		l.group.stopProxy() // frees the port if the new round reuses it
	}
	var proxy *storeproxy.Proxy
	storePort := 0
	if !l.cfg.NoStoreProxy && r.GroupRank == 0 {
		proxy, storePort = g.startProxy(r)
	}
	gs.env = func(w *worker, mark string) []string { return g.workerEnv(a, w, mark, storePort) }
	gs.launcher = g.launcher(server)
	grp, notStarted := startGroup(gs, a)
	grp.proxy = proxy
	if f, ok := gs.launcher.(*forkLauncher); ok {
		// The server's forks carry its mark until they write their own:
		// the group's end sweeps them too, but the server.
		grp.forkMark, grp.forkPid = g.forkMark, f.server.Pid()
	}
	for _, w := range g.spares {
		if w != nil && !slices.Contains(grp.workers, w) {
			w.discard()
		}
	}
	g.spares = nil
	if l.cfg.WarmSpares {
		// The spares wait until every worker has spoken (its imports are
		// done) or spareDelay passed, so that they do not compete with the
		// group's own start for CPU.
		sw := &spareWait{gs: gs, group: a, spoke: map[*worker]bool{}}
		g.spareFor = sw
		if g.spareTimer != nil {
			g.spareTimer.Stop()
		}
		g.spareTimer = time.AfterFunc(spareDelay, func() {
			l.call(func() {
				if g.spareFor == sw {
					g.startSparesNow()
				}
			})
		})
	}
	l.log.Info("workers started", "attempt", a.Attempt, "restart_count", a.RestartCount, "round", r.Number,
		"dir", grp.dir)
	return grp, notStarted
}

// launcher is how this group's workers start (launch.go): released from
// warm spares, forked from the fork server once it is ready, or exec'd; or
// the tests' stand-in (Config.launcher).
func (g *workerGroups) launcher(server *forkserver.Server) launcher {
	switch {
	case g.l.cfg.launcher != nil:
		return g.l.cfg.launcher
	case g.l.cfg.WarmSpares:
		return spareLauncher{spares: g.spares}
	case server != nil && server.WaitReady(g.l.stopping):
		return &forkLauncher{server: server}
	}
	return execLauncher{}
}

// workerEnv is the environment of worker w in attempt a (WorkerEnv);
// storePort is global rank 0's MASTER_PORT behind the store proxy, 0
// without it.
func (g *workerGroups) workerEnv(a StartGroup, w *worker, mark string, storePort int) []string {
	cfg := g.l.cfg
	return WorkerEnv(cfg.Env, workerSpec{group: a, localRank: w.localRank, localWorkers: cfg.NProcPerNode,
		maxRestarts: cfg.MaxRestarts, pod: cfg.Pod, errorFile: w.errorFile, progressFile: w.progressFile,
		storePort: storePort, mark: mark, torch2: g.torch2()})
}

func (*workerGroups) roundOutdated(time.Time) {}

func (*workerGroups) roundCompleted(Round) {}

// stop ends the fork server and the spares.
func (g *workerGroups) stop() {
	if g.fork != nil {
		g.fork.Stop()
	}
	if g.spareTimer != nil {
		g.spareTimer.Stop()
	}
	for _, w := range g.spares {
		if w != nil {
			w.discard()
		}
	}
}

// startProxy starts the group's store proxy on the round's MASTER_PORT and
// returns it with the private port for rank 0's store. If either port is
// unavailable the group runs without a proxy (rank 0 binds MASTER_PORT, as
// under torchrun) and only pays torch's connect retry.
func (g *workerGroups) startProxy(r Round) (*storeproxy.Proxy, int) {
	log := g.l.log
	// The private port stays reserved until the proxy listens, so the two
	// differ; like freePort it is closed before rank 0 binds it.
	hold, err := net.Listen("tcp", ":0")
	if err == nil {
		port := hold.Addr().(*net.TCPAddr).Port
		var p *storeproxy.Proxy
		p, err = storeproxy.Start(r.MasterPort, port, log)
		hold.Close()
		if err == nil {
			log.Info("store proxy started", "port", r.MasterPort, "rank0_port", port)
			return p, port
		}
	}
	log.Warn("no store proxy: rank 0 hosts the store on MASTER_PORT", "port", r.MasterPort, "err", err)
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

// torch2 reports whether the workers run torch 2.x; the first call waits for
// the probe.
func (g *workerGroups) torch2() bool {
	g.torchOnce.Do(func() {
		v := <-g.torchProbe
		g.torchIs2 = isTorch2(v)
		if v != "" {
			g.l.log.Info("workers' torch", "version", v)
		}
	})
	return g.torchIs2
}

// preload is what the fork server and the spares import ahead.
func (g *workerGroups) preload() string { return g.l.cfg.preload() }

// maxForkRestarts: a fork server that keeps dying is given up; workers are
// exec'd from then on.
const maxForkRestarts = 3

// startForkServer starts a fork server (agent/forkserver) for the command's
// interpreter, or goes on without one.
func (g *workerGroups) startForkServer() {
	l := g.l
	g.forkStarts++
	mark := fmt.Sprintf("%s/fork%d", l.agentID, g.forkStarts)
	logPath := filepath.Join(l.runDir, fmt.Sprintf("forkserver_%d.log", g.forkStarts))
	env := append(serverEnv(l.cfg.Env, l.cfg.NProcPerNode, g.torch2()), guardian.MarkEnv+"="+mark)
	s, err := forkserver.Start(l.cfg.Command[0], env, g.preload(), logPath, l.log)
	if err != nil {
		l.log.Warn("no fork server: workers are started with exec", "err", err)
		return
	}
	l.guard.Register(s.Pid(), true)
	g.fork, g.forkMark = s, mark
	l.log.Info("fork server starting", "pid", s.Pid(), "preload", g.preload(), "log", logPath)
}

// forkServer returns the fork server for the next group, nil for exec; the
// first group starts the first server. A server that refused to fork is
// given up; one that died is replaced, at most maxForkRestarts times, and
// that group is exec'd while the new one imports.
func (g *workerGroups) forkServer() *forkserver.Server {
	l := g.l
	if g.forkWanted && g.forkStarts == 0 {
		// Not before the first round: its imports would compete for the
		// CPU with the master's node check, a timing test, and skew it.
		// Started now, with the first group waiting for it, a cold start
		// costs one import and forks, where exec costs one import per
		// worker, side by side.
		g.startForkServer()
	}
	s := g.fork
	if s == nil {
		return nil
	}
	if why := s.Refused(); why != "" {
		l.log.Error("fork server given up: workers are started with exec from now on", "err", why)
		s.Stop()
		l.guard.Register(s.Pid(), false)
		g.fork = nil
		return nil
	}
	if !s.IsDead() {
		return s
	}
	l.guard.Register(s.Pid(), false)
	g.fork = nil
	if !s.IsReady() {
		// It never got as far as forking (an interpreter too old, a broken
		// environment): a new one would not either.
		l.log.Error("fork server died before it was ready: workers are started with exec from now on",
			"its_log", s.LogTail(2048))
		return nil
	}
	if g.forkStarts > maxForkRestarts {
		l.log.Error("fork server died again: workers are started with exec from now on", "servers_started", g.forkStarts)
		return nil
	}
	l.log.Warn("fork server died: starting a new one; this attempt's workers are started with exec", "pid", s.Pid())
	g.startForkServer()
	return nil
}

// spareDelay is the longest the spares wait for the group to speak.
const spareDelay = 10 * time.Second

// spareWait is a group whose workers the next attempt's spares wait for.
type spareWait struct {
	gs    groupStart
	group StartGroup
	spoke map[*worker]bool
}

// spoke notes that worker w printed its first line; once every worker of
// the running group has, the next attempt's spares start.
func (g *workerGroups) spoke(w *worker) {
	l := g.l
	if sw := g.spareFor; sw != nil && l.group != nil && slices.Contains(l.group.workers, w) {
		sw.spoke[w] = true
		if len(sw.spoke) == l.cfg.NProcPerNode {
			g.startSparesNow()
		}
	}
}

func (g *workerGroups) startSparesNow() {
	sw := g.spareFor
	g.spareFor = nil
	if g.spareTimer != nil {
		g.spareTimer.Stop()
	}
	l := g.l
	if sw == nil || l.policy.Done() || l.group == nil || l.group.attempt != sw.group.Attempt {
		return
	}
	g.startSpares(sw.gs, sw.group)
}

// startSpares starts the next attempt's warm spares (WarmSpares).
func (g *workerGroups) startSpares(gs groupStart, a StartGroup) {
	l := g.l
	next := StartGroup{Attempt: a.Attempt + 1, RestartCount: a.RestartCount, Round: a.Round}
	g.spares = make([]*worker, l.cfg.NProcPerNode)
	for local := range l.cfg.NProcPerNode {
		select {
		case <-l.stopping:
			return // a stop signal: no next attempt to start spares for
		default:
		}
		probe := newWorker(gs, next.Attempt, local)
		env := g.workerEnv(next, probe, guardian.AttemptMark(gs.agentID, next.Attempt), 0)
		w, err := startSpare(gs, next.Attempt, local, env, g.preload())
		if err != nil {
			l.log.Warn("no warm spare", "attempt", next.Attempt, "local_rank", local, "err", err)
			continue
		}
		g.spares[local] = w
	}
}
