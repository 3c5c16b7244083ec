package master

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	kferrors "github.com/kfelastic/kfelastic/errors"
)

// TestScenarios replays the scripts in testdata/scenarios against the Job
// state machine (cockroachdb/datadriven: a command, "----", what the master
// answered and did; run with -rewrite to accept a deliberate change, then
// read the diff). Commands:
//
//	config min=2 max=3 [unit=1] [waiting=30s] [join-timeout=…] [pend-timeout=…]
//	       [heartbeat-timeout=30s] [check] [exclude-straggler] [check-timeout=…] [max-relaunches=5]
//	at 12s                          set the clock (from the scenario's start)
//	join w0 [rank=0] [lws=2] [inc=1] [host=h0] [pod=NAME] [after=N]   a pod joins (or
//	                                 asks again); pod: the first join of w0 names its
//	                                 pod NAME (a second container under one name);
//	                                 after: it asks for the round after N, not after
//	                                 the latest it got (that answer was lost)
//	heartbeat w0                    a pod's heartbeat, in the round it runs
//	report w0 ok|fail [self] [elapsed=1s] [ready=2s] [msg=…]   its result of its current
//	                                 check task; self: the failure is its own;
//	                                 ready: when it reached its group
//	leave w0 ok|CODE [user]          a pod's agent ends; CODE recoverable unless "user"
//	gone w0 CODE                     the pod owner saw the pod die (OOMKilled, Evicted…)
//	notready w0 node=n1 [condition=…] the node controller's NodeNotReady on w0's pod
//	                                 (the node's condition, "_" for a space)
//	die w0                           its agent stops calling (hung, cut off); nobody
//	                                 tells the master (the simulator's silent death)
//	tick                             time passes (timeouts, last call)
//	stall 15s                        the master cannot answer for 15s (its state
//	                                 write hangs), then goes on
//	master-restart                   the master restarts from the records it
//	                                 wrote (every step's dirty records)
//	nodes                            every rank's record
//
// After each command the runner prints the answers and then what the state
// machine reported: rounds, check rounds (DLRover's log lines), decisions,
// stops. The scripts sim_<seed>.txt are histories TestSim found failing
// (sim_test.go): after each of their commands the master's promises are
// checked as TestSim checks them.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		s := &scenario{t: t, t0: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), pods: map[string]*scenarioPod{}}
		s.now = s.t0
		var sim *simRun
		if strings.HasPrefix(filepath.Base(path), "sim_") {
			sim = simAround(s)
		}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if sim == nil {
				return s.run(d.FullCmd())
			}
			failed := sim.fail != nil
			out, _ := sim.doOut(d.FullCmd())
			if !failed && sim.fail != nil {
				t.Errorf("%s:%d: %s", d.Pos, sim.fail.step, sim.fail)
			}
			return out
		})
	})
}

type scenarioPod struct {
	name        string // the script's name for it
	podName     string // the pod's name (name, unless join pod=…)
	rank        int
	incarnation int
	lws         int
	host        string
	// after is the latest round the pod got; it joins the one after.
	after int64
	// round is the round its workers run in (0: none).
	round int64
	task  *CheckTask
	left  bool
}

type scenario struct {
	t    testing.TB
	job  *Job
	t0   time.Time
	now  time.Time
	pods map[string]*scenarioPod
	// state is what the master wrote so far, for master-restart.
	state *merger
	// What the last command was answered, for the simulator (sim_test.go):
	// the answer to a join or a heartbeat (nil: the command made none, or
	// it was refused, err), and the answers of the calls it woke, by the
	// script's pod name.
	lastJoin *JoinAnswer
	lastHB   *HeartbeatAnswer
	lastErr  error
	woken    map[string]JoinAnswer
	hbWoken  map[string]HeartbeatAnswer
	// wake is what the command's Ready woke: these ranks, or all.
	wake    map[int]bool
	wakeAll bool
}

func (s *scenario) args(fields []string) map[string]string {
	m := map[string]string{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			v = "true"
		}
		m[k] = v
	}
	return m
}

func (s *scenario) dur(v string) time.Duration {
	d, err := time.ParseDuration(v)
	if err != nil {
		s.t.Fatalf("bad duration %q: %v", v, err)
	}
	return d
}

func (s *scenario) num(v string) int {
	n, err := strconv.Atoi(v)
	if err != nil {
		s.t.Fatalf("bad number %q: %v", v, err)
	}
	return n
}

func (s *scenario) pod(name string) *scenarioPod {
	p, ok := s.pods[name]
	if !ok {
		p = &scenarioPod{name: name, podName: name, rank: -1, incarnation: 1, lws: 1}
		if i := strings.LastIndexAny(name, "0123456789"); i >= 0 {
			j := i
			for j > 0 && name[j-1] >= '0' && name[j-1] <= '9' {
				j--
			}
			p.rank, _ = strconv.Atoi(name[j : i+1])
		}
		p.host = "host-" + name
		s.pods[name] = p
	}
	return p
}

func (p *scenarioPod) info() NodeInfo {
	return NodeInfo{Pod: p.podName, Incarnation: fmt.Sprint(p.incarnation), Rank: p.rank, LocalWorldSize: p.lws,
		Addr: "addr-" + p.name, Port: 29500, Host: p.host}
}

func (s *scenario) run(command string) string {
	f := strings.Fields(command)
	var b strings.Builder
	s.lastJoin, s.lastHB, s.lastErr, s.woken, s.hbWoken = nil, nil, nil, map[string]JoinAnswer{}, map[string]HeartbeatAnswer{}
	s.wake, s.wakeAll = nil, false
	switch f[0] {
	case "config":
		a := s.args(f[1:])
		cfg := Config{JobID: "job", MinNodes: s.num(a["min"]), MaxNodes: s.num(a["max"])}
		if v, ok := a["unit"]; ok {
			cfg.NodeUnit = s.num(v)
		}
		if v, ok := a["expected"]; ok {
			cfg.ExpectedNodes = s.num(v)
		}
		for k, d := range map[string]*time.Duration{"waiting": &cfg.WaitingTimeout, "join-timeout": &cfg.JoinTimeout,
			"pend-timeout": &cfg.PendTimeout, "heartbeat-timeout": &cfg.HeartbeatTimeout, "check-timeout": &cfg.CheckTimeout} {
			if v, ok := a[k]; ok {
				*d = s.dur(v)
			}
		}
		cfg.NetworkCheck = a["check"] == "true"
		cfg.ExcludeStraggler = a["exclude-straggler"] == "true"
		if v, ok := a["max-relaunches"]; ok {
			cfg.Relaunch.MaxPerRank = s.num(v)
			cfg.Relaunch.OOM.Factor = 2
		}
		j, err := NewJob(cfg)
		if err != nil {
			return "error: " + err.Error()
		}
		s.job = j
		s.state = newMerger()
		s.pods = map[string]*scenarioPod{} // a new job: its pods are new
		c := j.Config()
		fmt.Fprintf(&b, "nnodes=%d:%d unit=%d waiting=%s heartbeat-timeout=%s check=%v", c.MinNodes, c.MaxNodes,
			c.NodeUnit, c.WaitingTimeout, c.HeartbeatTimeout, c.NetworkCheck)
		return b.String()
	case "at":
		s.now = s.t0.Add(s.dur(f[1]))
		return "t=" + f[1]
	case "join":
		_, known := s.pods[f[1]]
		p := s.pod(f[1])
		a := s.args(f[2:])
		if v, ok := a["pod"]; ok && !known {
			p.podName = v
		}
		if v, ok := a["rank"]; ok {
			p.rank = s.num(v)
		}
		if v, ok := a["lws"]; ok {
			p.lws = s.num(v)
		}
		if v, ok := a["host"]; ok {
			p.host = v
		}
		if v, ok := a["inc"]; ok {
			if n := s.num(v); n != p.incarnation {
				p.incarnation, p.after, p.round, p.left = n, 0, 0, false
			}
		}
		p.round = 0 // its workers stopped to join
		p.left = false
		if v, ok := a["after"]; ok {
			p.after = int64(s.num(v))
		}
		ans, err := s.job.Join(p.info(), p.after, s.now)
		if err != nil {
			s.lastErr = err
			fmt.Fprintf(&b, "%s: error: %v", p.name, err)
		} else {
			s.lastJoin = &ans
			b.WriteString(s.answer(p, ans))
		}
	case "heartbeat":
		p := s.pod(f[1])
		ha, err := s.job.Heartbeat(p.info(), p.round, -1, s.now)
		if err != nil {
			s.lastErr = err
			fmt.Fprintf(&b, "%s: error: %v", p.name, err)
			break
		}
		s.lastHB = &ha
		fmt.Fprintf(&b, "%s: %s", p.name, ha.Action)
		if ha.Exit != nil {
			fmt.Fprintf(&b, " %s", excl(ha.Exit))
		}
	case "report":
		p := s.pod(f[1])
		if p.task == nil {
			return p.name + ": no check task"
		}
		a := s.args(f[3:])
		rep := CheckReport{OK: f[2] == "ok", Self: a["self"] == "true", Elapsed: time.Second, Message: a["msg"]}
		if v, ok := a["elapsed"]; ok {
			rep.Elapsed = s.dur(v)
		}
		if v, ok := a["ready"]; ok {
			rep.Ready = s.dur(v)
		}
		if !rep.OK && rep.Message == "" {
			rep.Message = "check failed"
		}
		if err := s.job.ReportCheck(p.info(), p.task.Check, p.task.Round, rep, s.now); err != nil {
			s.lastErr = err
			fmt.Fprintf(&b, "%s: error: %v", p.name, err)
		}
		p.task = nil
		fmt.Fprintf(&b, "%s: reported", p.name)
	case "leave":
		p := s.pod(f[1])
		var d Decision
		var err error
		if f[2] == "ok" {
			d, err = s.job.Leave(p.info(), true, kferrors.Failure{}, s.now)
		} else {
			user := len(f) > 3 && f[3] == "user"
			d, err = s.job.Leave(p.info(), false, kferrors.Failure{Code: f[2], Message: f[2] + " in " + p.name, Recoverable: !user}, s.now)
		}
		if err != nil {
			s.lastErr = err
			fmt.Fprintf(&b, "%s: error: %v", p.name, err)
		} else {
			fmt.Fprintf(&b, "%s: left, relaunch=%v", p.name, d.Kind != 0 && d.Kind != StopJob)
		}
		p.round = 0
		p.left = true
	case "gone":
		p := s.pod(f[1])
		_, ok := s.job.PodGone(p.podName, kferrors.Failure{Code: f[2], Message: f[2], Recoverable: true}, s.now)
		fmt.Fprintf(&b, "%s: gone (news to the master: %v)", p.name, ok)
	case "notready":
		p := s.pod(f[1])
		a := s.args(f[2:])
		n := NodeNotReady{Pod: p.podName, Node: a["node"], Condition: strings.ReplaceAll(a["condition"], "_", " "), At: s.now}
		d, ok := s.job.NodeNotReady(n, s.now)
		fmt.Fprintf(&b, "%s: node %s not ready (taken out: %v)", p.name, n.Node, ok)
		if ok {
			fmt.Fprintf(&b, ", relaunch=%s", KindName(d.Kind))
		}
	case "die":
		p := s.pod(f[1])
		p.left, p.round, p.task = true, 0, nil
		fmt.Fprintf(&b, "%s: silent from now on", p.name)
	case "tick":
		s.job.Tick(s.now)
		b.WriteString("tick")
	case "stall":
		// The loop waits on its state for d: nothing is applied meanwhile,
		// then it tells the job, as Server.Run does.
		d := s.dur(f[1])
		s.now = s.now.Add(d)
		s.job.Stalled(d, s.now)
		fmt.Fprintf(&b, "stalled %s, t=%s", d, s.now.Sub(s.t0))
	case "master-restart":
		// From the batches written, as a restarted master loads them; a
		// snapshot of the job as it was must restore the same.
		cfg := s.job.Config()
		j, err := RestoreJob(cfg, s.state.records(), s.now)
		if err != nil {
			return "error: " + err.Error()
		}
		snap, err := RestoreJob(cfg, s.job.allRecords(), s.now)
		if err != nil {
			s.t.Fatalf("restore from a snapshot: %v", err)
		}
		sameRestored(s.t, snap, j)
		s.job = j
		j.Ready() // a restarted master writes nothing of its load
		var claims []string
		for _, r := range slices.Sorted(maps.Keys(j.claims)) {
			c := j.claims[r]
			claims = append(claims, fmt.Sprintf("%s for rank %d", c.n.Pod, r))
			if c.expired {
				claims[len(claims)-1] += " (expired)"
			}
		}
		fmt.Fprintf(&b, "master restarted: %d nodes, claims [%s]", len(j.nodes), strings.Join(claims, ", "))
	case "nodes":
		for _, n := range s.job.Nodes() {
			fmt.Fprintf(&b, "rank %d: %s %s round=%d checked=%v relaunches=%d", n.Rank, n.Pod, n.State, n.Round, n.Checked, n.Relaunches)
			if n.Relaunching {
				b.WriteString(" relaunching")
			}
			if n.Exclusion != nil {
				fmt.Fprintf(&b, " exit=%s", n.Exclusion.Code)
			}
			b.WriteString("\n")
		}
		return strings.TrimSpace(b.String())
	default:
		s.t.Fatalf("unknown command %q", f[0])
	}
	s.ready(&b)
	return strings.TrimSpace(b.String())
}

// rankOf is the rank p asked for, or, for a pod that let the master
// choose (rank=-1), the one the master gave it (-1 if none): its waiting
// calls are woken by that rank.
func (s *scenario) rankOf(p *scenarioPod) int {
	if p.rank >= 0 {
		return p.rank
	}
	if r, ok := s.job.byPod[p.podName]; ok {
		return r
	}
	return -1
}

func excl(e *Exclusion) string {
	r := "no relaunch"
	if e.Relaunch {
		r = "relaunch"
	}
	return fmt.Sprintf("exit %s (%s): %s", e.Code, r, e.Message)
}

func (s *scenario) answer(p *scenarioPod, a JoinAnswer) string {
	switch {
	case a.Round != nil:
		r := a.Round
		p.after, p.round = r.Number, r.Number
		return fmt.Sprintf("%s: round %d group_rank=%d group_world_size=%d world_size=%d first_global_rank=%d master=%s:%d",
			p.name, r.Number, r.GroupRank, r.GroupWorldSize, r.WorldSize, r.FirstGlobalRank, r.MasterAddr, r.MasterPort)
	case a.Check != nil:
		c := *a.Check
		p.task = &c
		return fmt.Sprintf("%s: check %d round %d: group %d rank %d of %d, meet at %s:%d", p.name, c.Check, c.Round,
			c.Group, c.GroupRank, c.GroupSize, c.LeaderAddr, c.LeaderPort)
	case a.Excluded != nil:
		return fmt.Sprintf("%s: %s", p.name, excl(a.Excluded))
	}
	return fmt.Sprintf("%s: pending (%d waiting)", p.name, a.Waiting)
}

// ready prints what the state machine asked the loop to do, and what the
// woken pods would now be answered.
func (s *scenario) ready(b *strings.Builder) {
	r := s.job.Ready()
	s.wake, s.wakeAll = r.Wake, r.WakeAll
	s.state.add(s.job.dirtyRecords(r.Dirty))
	for _, l := range r.Log {
		if strings.HasPrefix(l.Msg, "Round ") || l.Level == "warn" {
			fmt.Fprintf(b, "\nlog: %s", l.Msg)
		}
	}
	for _, n := range r.Rounds {
		lr := s.job.Latest()
		if lr != nil && lr.Number == n {
			pods := make([]string, len(lr.Ranks))
			for i, rank := range lr.Ranks {
				nd, _ := s.job.Node(rank)
				pods[i] = nd.Pod
			}
			fmt.Fprintf(b, "\nround %d completed: %s", n, strings.Join(pods, " "))
			if lr.Departed > 0 {
				fmt.Fprintf(b, " (departed %d", lr.Departed)
				if !lr.DepartedSince.IsZero() {
					fmt.Fprintf(b, ", failed at %v", lr.DepartedSince.Sub(s.t0))
				}
				b.WriteString(")")
			} else if lr.DepartedKnown {
				// A command-mode agent's relay then forgets no c10d node.
				b.WriteString(" (none departed)")
			}
		}
	}
	for _, d := range r.Decided {
		fmt.Fprintf(b, "\n%s", d)
		if d.Counted {
			b.WriteString(" (counted)")
		}
	}
	// The pods woken by this step, answered as their waiting calls would be.
	var woken []string
	for name, p := range s.pods {
		if r.WakeAll || r.Wake[s.rankOf(p)] {
			woken = append(woken, name)
		}
	}
	slices.Sort(woken)
	for _, name := range woken {
		p := s.pods[name]
		if p.round != 0 || p.left {
			continue // training: it hears of it on its heartbeat; or gone
		}
		rank := s.rankOf(p)
		nd, ok := s.job.Node(rank)
		cp, ci, claims := s.job.Claimant(rank)
		claimant := claims && cp == p.podName && ci == fmt.Sprint(p.incarnation)
		if !claimant && (!ok || nd.Pod != p.podName || nd.Incarnation != fmt.Sprint(p.incarnation) || nd.State != Joining && nd.State != Running && nd.Exclusion == nil) {
			continue
		}
		a := s.job.Answer(p.podName, fmt.Sprint(p.incarnation), rank, p.after)
		if a.Pending() {
			continue
		}
		s.woken[name] = a
		fmt.Fprintf(b, "\n  woken %s", s.answer(p, a))
	}
	// The heartbeats held, answered as the loop answers them when woken: all
	// of them, or those of the woken ranks.
	if r.WakeHeartbeats || r.WakeAll || len(r.Wake) > 0 {
		var hb []string
		for name, p := range s.pods {
			if rank := s.rankOf(p); p.round != 0 && (r.WakeHeartbeats || r.WakeAll || r.Wake[rank]) {
				if a := s.job.HeartbeatAnswer(p.podName, fmt.Sprint(p.incarnation), rank, p.round); a.Action != Continue {
					s.hbWoken[name] = a
					hb = append(hb, fmt.Sprintf("%s: %s", name, a.Action))
				}
			}
		}
		slices.Sort(hb)
		for _, h := range hb {
			fmt.Fprintf(b, "\n  heartbeat %s", h)
		}
	}
	if stopped, why := s.job.Stopped(); stopped && r.WakeAll {
		fmt.Fprintf(b, "\njob stopped: %s", why)
	}
}
