package master

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

var (
	simSeed  = flag.Uint64("sim.seed", 1, "first seed of TestSim's histories")
	simN     = flag.Int("sim.n", 10000, "how many histories TestSim runs")
	simSteps = flag.Int("sim.steps", 40, "commands of a TestSim history before its drain")
	simWrite = flag.Bool("sim.write", false,
		"write each history TestSim finds failing, shrunk, as testdata/scenarios/sim_<seed>.txt")
)

// TestSim is the simulator of whole jobs around the Job state machine
// (issue 28): from each seed a random history of scenario commands (the
// language of TestScenarios, scenario_test.go) for 2 to 6 agents under a
// random configuration: agents join, heartbeat, run the node check, succeed,
// fail with and without restarts left, die silently, come back under their
// pod's name (a new incarnation) or another, run twice under one pod name,
// arrive late; the pod owner sees pods die and carries out relaunches; the
// master's state stalls and the master restarts from its records; the clock
// jumps. Then a drain: no more faults, every live agent does what it is told
// and the owner relaunches what the master asks, until the job is quiet.
// After every command simCheck checks the master's promises (docs/DESIGN.md
// §5.12). A failing history is shrunk (commands dropped while the same
// promise still fails) and printed; -sim.write writes it as a scenario
// script, testdata/scenarios/sim_<seed>.txt, which TestScenarios then
// replays, checking the same promises after every command.
func TestSim(t *testing.T) {
	start := time.Now()
	cmds, failed := 0, 0
	for i := range *simN {
		seed := *simSeed + uint64(i)
		r, prefix := simGenerate(t, seed, *simSteps)
		cmds += len(r.cmds)
		if r.fail == nil {
			continue
		}
		failed++
		simReport(t, seed, r, prefix)
		if failed == 3 {
			t.Fatalf("stopping after %d failing histories", failed)
		}
	}
	t.Logf("%d histories from seed %d, %d commands, in %s", *simN, *simSeed, cmds, time.Since(start).Round(time.Millisecond))
}

// simReport shrinks a failing history, prints it, and writes it under
// -sim.write.
func simReport(t *testing.T, seed uint64, r *simRun, prefix []string) {
	t.Helper()
	v := *r.fail
	short := simShrink(t, prefix, v.inv)
	sr := simReplay(t, short)
	if sr.fail == nil || sr.fail.inv != v.inv {
		t.Fatalf("shrinking seed %d lost its failure", seed) // simShrink keeps only failing candidates
	}
	script := simScript(seed, sr)
	var tail strings.Builder
	for i := max(0, len(r.cmds)-12); i < len(r.cmds); i++ {
		fmt.Fprintf(&tail, "  %d %s\n    %s\n", i, r.cmds[i], strings.ReplaceAll(r.outs[i], "\n", "\n    "))
	}
	t.Logf("seed %d, the last commands before it failed (%d of them were its random part):\n%s", seed, len(prefix), tail.String())
	path := filepath.Join("testdata", "scenarios", fmt.Sprintf("sim_%d.txt", seed))
	t.Errorf("seed %d, step %d of %d: %s\nshrunk to %d commands (step %d fails: %s); replay: go test ./master -run TestSim -sim.seed=%d -sim.n=1 [-sim.write: write it as %s]\n%s",
		seed, v.step, len(r.cmds), v, len(sr.cmds), sr.fail.step, sr.fail.msg, seed, path, script)
	if *simWrite {
		if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", path)
	}
}

// simScript is a replayed history as a datadriven script.
func simScript(seed uint64, r *simRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Found by TestSim, seed %d, shrunk: %s\n# (go test ./master -run TestSim -sim.seed=%d -sim.n=1)\n",
		seed, r.fail, seed)
	for i, c := range r.cmds {
		out := r.outs[i]
		sep := "----\n"
		if strings.Contains(out, "\n\n") {
			sep = "----\n----\n"
			out += "\n----"
		}
		fmt.Fprintf(&b, "%s\n%s%s\n\n", c, sep, out)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// simShrink drops commands (chunks, then single ones; never the config)
// while the history still fails invariant inv. Deterministic.
func simShrink(t *testing.T, cmds []string, inv string) []string {
	fails := func(c []string) bool {
		r := simReplay(t, c)
		return r.fail != nil && r.fail.inv == inv
	}
	tries := 0
	for size := len(cmds) / 2; size >= 1 && tries < 3000; {
		changed := false
		for i := 1; i < len(cmds) && tries < 3000; {
			cand := slices.Concat(cmds[:i], cmds[min(i+size, len(cmds)):])
			tries++
			if fails(cand) {
				cmds, changed = cand, true
			} else {
				i += size
			}
		}
		if !changed {
			size /= 2
		}
	}
	return cmds
}

// simReplay runs a history's random part again, then its drain.
func simReplay(t testing.TB, cmds []string) *simRun {
	r := newSimRun(t)
	for _, c := range cmds {
		if !r.do(c) {
			return r
		}
	}
	r.drain()
	return r
}

// ---- the run: the scenario, its agents, and the promises checked ----

// simAgent is one agent (one container of a pod) as the simulator sees it.
type simAgent struct {
	// dead: it makes no call any more (it died, left, was told to exit,
	// or its pod is gone).
	dead bool
	// restart: it was told to restart its workers; it joins again.
	restart bool
}

// simViolation is a promise that failed: which, at which step, and how.
type simViolation struct {
	inv  string
	step int
	msg  string
}

func (v simViolation) String() string { return v.inv + ": " + v.msg }

type simStall struct {
	from   time.Time
	credit time.Duration
}

type simHeard struct {
	holder string // pod/incarnation
	at     time.Time
}

// simRun runs commands through a scenario and checks the promises after
// each.
type simRun struct {
	s      *scenario
	agents map[string]*simAgent
	names  []string // the agents, in the order they first joined
	cmds   []string
	outs   []string
	fail   *simViolation

	// closed: a node succeeded; closedRound is the latest round then.
	closed      bool
	closedRound int64
	// heard is, by rank, when the master last heard its holder.
	heard  map[int]simHeard
	stalls []simStall
	// held are, by pod name and rank, the incarnations that held it, in
	// order.
	held map[string][]string
	// quiet counts the rounds completed since the last event (an arrival,
	// a failure, a decision, a stall, a restart).
	quiet int
	// served are the relaunch decisions the owner carried out (a pod
	// joined for the rank since), by Seq: it carries out each once.
	served map[int64]bool
	// draining: the drain runs (no faults, prompt agents).
	draining bool
	// notReady are the holders (pod/incarnation) whose node the node
	// controller said was not ready: the sweep may take them out after a
	// third of the heartbeat timeout.
	notReady map[string]bool
}

// simTB turns the runner's fatal errors into a violation of the history
// rather than the end of the test.
type simTB struct{ testing.TB }

type simFatal struct{ msg string }

func (simTB) Helper()                           {}
func (simTB) Fatalf(format string, args ...any) { panic(simFatal{fmt.Sprintf(format, args...)}) }
func (simTB) Fatal(args ...any)                 { panic(simFatal{fmt.Sprint(args...)}) }
func (simTB) Errorf(format string, args ...any) { panic(simFatal{fmt.Sprintf(format, args...)}) }

func newSimRun(t testing.TB) *simRun {
	s := &scenario{t: simTB{t}, t0: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), pods: map[string]*scenarioPod{}}
	s.now = s.t0
	return simAround(s)
}

func simAround(s *scenario) *simRun {
	return &simRun{s: s, agents: map[string]*simAgent{}, heard: map[int]simHeard{}, held: map[string][]string{}, notReady: map[string]bool{},
		served: map[int64]bool{}}
}

type simSnap struct {
	nodes     map[int]Node
	decisions int
	round     int64
	stopped   bool
}

func (r *simRun) snap() simSnap {
	sn := simSnap{nodes: map[int]Node{}}
	j := r.s.job
	if j == nil {
		return sn
	}
	for _, n := range j.Nodes() {
		sn.nodes[n.Rank] = n
	}
	sn.decisions = len(j.decisions)
	sn.round = j.latestNumber()
	sn.stopped, _ = j.Stopped()
	return sn
}

// do runs one command and checks the promises; false once one failed.
func (r *simRun) do(cmd string) bool {
	_, ok := r.doOut(cmd)
	return ok
}

func (r *simRun) doOut(cmd string) (out string, ok bool) {
	if r.fail != nil {
		return "", false
	}
	pre := r.snap()
	// A running agent that joins unasked restarts its workers (one
	// failed, with restarts left): an event, as a failure is.
	f := strings.Fields(cmd)
	if f[0] == "notready" {
		if p := r.s.pods[f[1]]; p != nil {
			for _, n := range pre.nodes {
				if n.Pod == p.podName {
					r.notReady[n.Pod+"/"+n.Incarnation] = true
				}
			}
		}
	}
	restarts := false
	if f[0] == "join" {
		if p, a := r.s.pods[f[1]], r.agents[f[1]]; p != nil && a != nil && p.round != 0 && !a.restart {
			restarts = true
		}
	}
	func() {
		defer func() {
			if x := recover(); x != nil {
				f, fatal := x.(simFatal)
				if !fatal {
					panic(x)
				}
				r.fail = &simViolation{inv: "runner", step: len(r.cmds), msg: f.msg}
			}
		}()
		out = r.s.run(cmd)
	}()
	r.cmds = append(r.cmds, cmd)
	r.outs = append(r.outs, out)
	if r.fail != nil {
		return out, false
	}
	arrival := r.observe(cmd)
	if inv, msg := r.check(cmd, pre, arrival || restarts); inv != "" {
		r.fail = &simViolation{inv: inv, step: len(r.cmds) - 1, msg: fmt.Sprintf("after %q: %s", cmd, msg)}
		return out, false
	}
	return out, true
}

// observe updates the agents from what the command's calls were answered;
// arrival: the command is an agent's first join.
func (r *simRun) observe(cmd string) (arrival bool) {
	f := strings.Fields(cmd)
	s := r.s
	switch f[0] {
	case "config":
		r.agents, r.names = map[string]*simAgent{}, nil
	case "join", "heartbeat", "report", "leave", "gone", "die":
		a := r.agents[f[1]]
		if a == nil {
			if f[0] != "join" {
				break
			}
			a = &simAgent{}
			r.agents[f[1]] = a
			r.names = append(r.names, f[1])
			arrival = true
			if d, ok := r.lastRelaunch(s.pods[f[1]].rank); ok {
				r.served[d.Seq] = true
			}
		}
		switch f[0] {
		case "join":
			a.restart = false
			if s.lastErr != nil || s.lastJoin != nil && s.lastJoin.Excluded != nil {
				a.dead = true
			}
		case "heartbeat":
			switch {
			case s.lastErr != nil || s.lastHB.Action == Exit:
				a.dead = true
			case s.lastHB.Action == Restart:
				a.restart = true
			}
		case "leave", "gone", "die":
			a.dead = true
		}
	}
	for name, ans := range s.woken {
		if a := r.agents[name]; a != nil && ans.Excluded != nil {
			a.dead = true
		}
	}
	// The loop answers every waiting call of a woken rank, also those of
	// pods the runner does not print (one that lost its rank to another).
	if s.job != nil && (s.wakeAll || len(s.wake) > 0) {
		for _, name := range r.names {
			a, p := r.agents[name], s.pods[name]
			if _, told := s.woken[name]; told || a.dead || p.round != 0 || p.task != nil || !(s.wakeAll || s.wake[r.rankOf(p)]) {
				continue
			}
			if ans := s.job.Answer(p.podName, r.inc(p), r.rankOf(p), p.after); ans.Excluded != nil {
				a.dead = true
			}
		}
	}
	for name, ha := range s.hbWoken {
		if a := r.agents[name]; a != nil {
			switch ha.Action {
			case Exit:
				a.dead = true
			case Restart:
				a.restart = true
			}
		}
	}
	return arrival
}

// live are the agents that still call, by name.
func (r *simRun) live() []string {
	var out []string
	for _, name := range r.names {
		if !r.agents[name].dead {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func (r *simRun) inc(p *scenarioPod) string { return strconv.Itoa(p.incarnation) }

// rankOf is the rank p asks for or was given, or -1.
func (r *simRun) rankOf(p *scenarioPod) int { return r.s.rankOf(p) }

// holds reports whether p's incarnation is the holder of its rank.
func (r *simRun) holds(p *scenarioPod) bool {
	n, ok := r.s.job.Node(r.rankOf(p))
	return ok && n.Pod == p.podName && n.Incarnation == r.inc(p)
}

// check checks the promises after cmd; pre is the job before it; event:
// the command is an agent's first join or a restart of its workers. It
// returns the promise that failed ("" if none) and how.
func (r *simRun) check(cmd string, pre simSnap, event bool) (string, string) {
	j := r.s.job
	if j == nil {
		return "", ""
	}
	f := strings.Fields(cmd)
	now := r.s.now
	cfg := j.Config()
	if f[0] == "config" {
		r.closed, r.closedRound, r.heard, r.stalls, r.held, r.quiet = false, 0, map[int]simHeard{}, nil, map[string][]string{}, 0
		r.served = map[int64]bool{}
		return "", ""
	}
	nodes := j.Nodes()
	decs := j.Decisions()
	latest := j.Latest()
	round := j.latestNumber()
	stopped, why := j.Stopped()
	var fresh []Decision
	if len(decs) >= pre.decisions {
		fresh = decs[pre.decisions:]
	}

	// Durable: a restarted master has every decision, the round, the stop.
	if f[0] == "master-restart" {
		if len(decs) != pre.decisions || round != pre.round || stopped != pre.stopped {
			return "durable", fmt.Sprintf("the restarted master has %d decisions, round %d, stopped=%v; before: %d, %d, %v",
				len(decs), round, stopped, pre.decisions, pre.round, pre.stopped)
		}
		fresh = nil
	}
	if len(decs) < pre.decisions {
		return "durable", fmt.Sprintf("decisions went from %d to %d", pre.decisions, len(decs))
	}

	// Ranks: a round's ranks are distinct, within [0, max), its size
	// within [min, max] and a multiple of the unit; one pod holds at most
	// one live rank.
	if round < pre.round {
		return "ranks", fmt.Sprintf("the latest round went back from %d to %d", pre.round, round)
	}
	if latest != nil && round != pre.round {
		seen := map[int]bool{}
		for _, rank := range latest.Ranks {
			if rank < 0 || rank >= cfg.MaxNodes || seen[rank] {
				return "ranks", fmt.Sprintf("round %d has ranks %v (max %d)", round, latest.Ranks, cfg.MaxNodes)
			}
			seen[rank] = true
			if n, ok := j.Node(rank); !ok || n.State != Running || n.Round != round {
				return "ranks", fmt.Sprintf("round %d: rank %d (%s) is not running it: %s, round %d", round, rank, n.Pod, n.State, n.Round)
			}
		}
		if k := len(latest.Ranks); k < cfg.MinNodes || k > cfg.MaxNodes || k%cfg.NodeUnit != 0 || len(latest.LocalWorldSizes) != k {
			return "ranks", fmt.Sprintf("round %d has %d members (nnodes %d:%d, unit %d)", round, k, cfg.MinNodes, cfg.MaxNodes, cfg.NodeUnit)
		}
	}
	livePod := map[string]int{}
	for _, n := range nodes {
		if n.State.alive() && n.Exclusion == nil {
			if other, ok := livePod[n.Pod]; ok {
				return "ranks", fmt.Sprintf("pod %s holds ranks %d and %d", n.Pod, other, n.Rank)
			}
			livePod[n.Pod] = n.Rank
		}
	}

	// Closed after success: no round forms, nobody is restarted or
	// relaunched, a late joiner is told the job is done.
	if r.closed {
		if round != r.closedRound {
			return "closed", fmt.Sprintf("round %d formed after a node succeeded in round %d", round, r.closedRound)
		}
		for _, d := range fresh {
			if d.Kind != relaunch.None && d.Kind != StopJob {
				return "closed", fmt.Sprintf("after a node succeeded: %s", d)
			}
		}
		for _, n := range nodes {
			if n.Relaunching {
				return "closed", fmt.Sprintf("rank %d (%s) waits for its relaunch after a node succeeded", n.Rank, n.Pod)
			}
		}
		if f[0] == "join" && r.s.lastJoin != nil {
			a := r.s.lastJoin
			switch {
			case a.Pending():
				return "closed", fmt.Sprintf("%s waits for a round after a node succeeded", f[1])
			case a.Round != nil && a.Round.Number != r.closedRound:
				return "closed", fmt.Sprintf("%s given round %d after a node succeeded", f[1], a.Round.Number)
			}
		}
		if f[0] == "heartbeat" && r.s.lastHB != nil && r.s.lastHB.Action == Restart {
			return "closed", fmt.Sprintf("%s told to restart after a node succeeded", f[1])
		}
		for name, ha := range r.s.hbWoken {
			if ha.Action == Restart {
				return "closed", fmt.Sprintf("%s told to restart after a node succeeded", name)
			}
		}
	}
	for _, n := range nodes {
		if n.State == Succeeded && !r.closed {
			r.closed, r.closedRound = true, round
		}
	}

	// No node lost to the master's own stall: a NodeLost needs the
	// heartbeat timeout of silence in which the master could answer.
	grace := min(time.Second, cfg.HeartbeatTimeout/4)
	if f[0] == "stall" {
		if d, err := time.ParseDuration(f[1]); err == nil && d > grace {
			r.stalls = append(r.stalls, simStall{from: now.Add(-d), credit: d - grace})
		}
	}
	for _, d := range fresh {
		if d.Kind == StopJob || d.Reason != kferrors.CodeNodeLost || f[0] != "tick" {
			continue // only a sweep's: the owner may report a pod lost (gone NodeLost)
		}
		h, ok := r.heard[d.Rank]
		if !ok {
			continue
		}
		silence := now.Sub(h.at)
		for _, st := range r.stalls {
			if !st.from.Before(h.at) {
				silence -= st.credit
			}
		}
		allowed := cfg.HeartbeatTimeout
		if r.notReady[h.holder] {
			allowed /= 3
		}
		if silence <= allowed {
			return "stall", fmt.Sprintf("rank %d (%s) lost after %s of silence the master could answer in (heard at %s, allowed %s)",
				d.Rank, h.holder, silence, h.at.Sub(r.s.t0), allowed)
		}
	}
	// Heard: a new holder, a holder's call, a restart's grace.
	caller := ""
	if f[0] == "join" || f[0] == "heartbeat" || f[0] == "report" {
		if p := r.s.pods[f[1]]; p != nil {
			caller = p.podName + "/" + r.inc(p)
		}
	}
	for _, n := range nodes {
		key := n.Pod + "/" + n.Incarnation
		if h, ok := r.heard[n.Rank]; !ok || h.holder != key || key == caller || f[0] == "master-restart" {
			r.heard[n.Rank] = simHeard{holder: key, at: now}
		}
	}

	// One incarnation per pod name: once a newer incarnation of a pod held
	// a rank, an older one never holds one again, and is never told to
	// restart.
	for _, n := range nodes {
		if !n.State.alive() {
			continue
		}
		// By pod and rank: the master fences an incarnation off the rank
		// it was replaced on (one that lets the master choose may get
		// another free rank).
		key := n.Pod + "@" + strconv.Itoa(n.Rank)
		h := r.held[key]
		if i := slices.Index(h, n.Incarnation); i < 0 {
			r.held[key] = append(h, n.Incarnation)
		} else if i < len(h)-1 {
			return "fence", fmt.Sprintf("pod %s incarnation %s holds rank %d again after incarnation %s replaced it",
				n.Pod, n.Incarnation, n.Rank, h[len(h)-1])
		}
	}
	replaced := func(name string) bool {
		p := r.s.pods[name]
		if p == nil {
			return false
		}
		h := r.held[p.podName+"@"+strconv.Itoa(r.rankOf(p))]
		i := slices.Index(h, r.inc(p))
		return i >= 0 && i < len(h)-1
	}
	if f[0] == "heartbeat" && r.s.lastHB != nil && r.s.lastHB.Action == Restart && replaced(f[1]) {
		return "fence", fmt.Sprintf("%s, a replaced incarnation, told to restart", f[1])
	}
	for name, ha := range r.s.hbWoken {
		if ha.Action == Restart && replaced(name) {
			return "fence", fmt.Sprintf("%s, a replaced incarnation, told to restart", name)
		}
	}

	// Every node the master ends is told why: its exclusion has a code
	// and a message, a failure has a decision, a stop a reason.
	newFor := map[int]int{}
	for _, d := range fresh {
		if d.Kind != StopJob {
			newFor[d.Rank]++
		}
	}
	for _, n := range nodes {
		if n.State == Failed && (n.Exclusion == nil || n.Exclusion.Code == "" || n.Exclusion.Message == "") {
			return "why", fmt.Sprintf("rank %d (%s) failed without an exclusion saying why: %+v", n.Rank, n.Pod, n.Exclusion)
		}
		if p, ok := pre.nodes[n.Rank]; ok && p.State.alive() && p.Exclusion == nil && n.State == Failed && newFor[n.Rank] == 0 {
			return "why", fmt.Sprintf("rank %d (%s) failed without a decision", n.Rank, n.Pod)
		}
	}
	if stopped && !pre.stopped {
		if why == "" || !slices.ContainsFunc(fresh, func(d Decision) bool { return d.Kind == StopJob }) {
			return "why", fmt.Sprintf("the job stopped without a stop decision (reason %q)", why)
		}
	}
	if stopped && why == "" {
		return "why", "the job is stopped without a reason"
	}
	excl := func(who string, e *Exclusion) string {
		if e != nil && (e.Code == "" || e.Message == "") {
			return fmt.Sprintf("%s told to exit without a code and a message: %+v", who, *e)
		}
		return ""
	}
	if r.s.lastJoin != nil {
		if m := excl(f[1], r.s.lastJoin.Excluded); m != "" {
			return "why", m
		}
	}
	if r.s.lastHB != nil {
		if m := excl(f[1], r.s.lastHB.Exit); m != "" {
			return "why", m
		}
		if r.s.lastHB.Action == Exit && r.s.lastHB.Exit == nil {
			return "why", f[1] + " told to exit without an exclusion"
		}
	}
	for name, a := range r.s.woken {
		if m := excl(name, a.Excluded); m != "" {
			return "why", m
		}
	}

	// Budgets are charged once: a rank's counted relaunches are its counted
	// decisions, within the budget; a failure gets one decision, for a rank
	// that was live.
	counted := map[int]int{}
	for _, d := range decs {
		if d.Counted {
			if d.Kind == relaunch.None || d.Kind == StopJob {
				return "budget", fmt.Sprintf("%s counted without a relaunch", d)
			}
			counted[d.Rank]++
		}
	}
	for _, n := range nodes {
		if n.Relaunches != counted[n.Rank] || n.Relaunches > cfg.Relaunch.MaxPerRank {
			return "budget", fmt.Sprintf("rank %d: %d relaunches, %d counted decisions, limit %d", n.Rank, n.Relaunches,
				counted[n.Rank], cfg.Relaunch.MaxPerRank)
		}
	}
	for rank, k := range newFor {
		if k > 1 {
			return "budget", fmt.Sprintf("rank %d got %d decisions at once", rank, k)
		}
		if p, ok := pre.nodes[rank]; !ok || !p.State.alive() || p.Exclusion != nil {
			return "budget", fmt.Sprintf("rank %d got a decision, but it was not live (%s)", rank, p.State)
		}
	}

	// No livelock: rounds complete because something happened.
	if round > pre.round {
		r.quiet += int(round - pre.round)
	}
	switch {
	case event, len(fresh) > 0, f[0] == "leave", f[0] == "gone", f[0] == "notready", f[0] == "die", f[0] == "stall", f[0] == "master-restart":
		r.quiet = 0
	case r.draining && r.quiet > simQuietRounds:
		// Only in the drain, where every agent does at once what it is
		// told: an agent slower to restart than the last call
		// (WaitingTimeout) may well miss a round, by design.
		return "livelock", fmt.Sprintf("%d rounds completed with no arrival, failure or decision among them", r.quiet)
	}
	return "", ""
}

// simQuietRounds is how many rounds may complete after one event: the
// round that takes it in, and one more for a member whose heartbeat was
// elsewhere while the first completed (missed_round.txt).
const simQuietRounds = 3

// natural is what an agent does next: report its check, join (again), or
// heartbeat.
func (r *simRun) natural(name string) string {
	p, a := r.s.pods[name], r.agents[name]
	switch {
	case p.task != nil:
		return "report " + name + " ok"
	case a.restart || p.round == 0:
		return simJoin(name, p.podName, p.rank, p.incarnation)
	}
	return "heartbeat " + name
}

func simJoin(name, pod string, rank, inc int) string {
	c := fmt.Sprintf("join %s rank=%d", name, rank)
	if pod != name {
		c += " pod=" + pod
	}
	if inc != 1 {
		c += fmt.Sprintf(" inc=%d", inc)
	}
	return c
}

// newIncarnation is the join of pod's next incarnation for rank.
func (r *simRun) newIncarnation(pod string, rank int) string {
	inc := 1
	for _, p := range r.s.pods {
		if p.podName == pod {
			inc = max(inc, p.incarnation+1)
		}
	}
	return simJoin(fmt.Sprintf("%s~%d", pod, inc), pod, rank, inc)
}

// newPod is the join of a new pod for rank.
func (r *simRun) newPod(rank int) string {
	for c := 'b'; ; c++ {
		name := fmt.Sprintf("w%d-%c", rank, c)
		if _, ok := r.s.pods[name]; !ok {
			return simJoin(name, name, rank, 1)
		}
	}
}

// lastRelaunch is the latest relaunch decided for rank.
func (r *simRun) lastRelaunch(rank int) (Decision, bool) {
	if r.s.job == nil || rank < 0 {
		return Decision{}, false
	}
	ds := r.s.job.decisions
	for i := len(ds) - 1; i >= 0; i-- {
		if d := ds[i]; d.Rank == rank && d.Kind != relaunch.None && d.Kind != StopJob {
			return d, true
		}
	}
	return Decision{}, false
}

// wanted are the ranks the master wants relaunched, whose decision the
// owner has not carried out and for which no live agent joins, by rank.
func (r *simRun) wanted() []Node {
	j := r.s.job
	if stopped, _ := j.Stopped(); stopped {
		return nil
	}
	var out []Node
	for _, n := range j.Nodes() {
		if d, ok := r.lastRelaunch(n.Rank); !n.Relaunching || !ok || r.served[d.Seq] {
			continue
		}
		if !slices.ContainsFunc(r.live(), func(name string) bool { return r.rankOf(r.s.pods[name]) == n.Rank }) {
			out = append(out, n)
		}
	}
	return out
}

// drain runs the job without faults until it is quiet: every live agent
// does what it is told, the owner relaunches what the master asks, time
// passes. Deterministic: a replay drains alike.
func (r *simRun) drain() {
	j := r.s.job
	if j == nil || r.fail != nil {
		return
	}
	r.draining, r.quiet = true, 0
	cfg := j.Config()
	step := max(time.Second, cfg.HeartbeatTimeout/3)
	limit := 3*int((cfg.JoinTimeout+cfg.PendTimeout+2*cfg.CheckTimeout+cfg.WaitingTimeout+2*cfg.HeartbeatTimeout)/step) + 30
	for i := 0; ; i++ {
		for _, n := range r.wanted() {
			if !r.do(r.newIncarnation(n.Pod, n.Rank)) {
				return
			}
		}
		for pass := 0; pass < 2; pass++ {
			for _, name := range r.live() {
				if (pass == 0 || r.agents[name].restart) && !r.agents[name].dead {
					if !r.do(r.natural(name)) {
						return
					}
				}
			}
		}
		if r.quietNow() {
			if stopped, _ := j.Stopped(); !stopped && !r.closed && len(r.live()) == 0 && len(j.Nodes()) > 0 {
				r.fail = &simViolation{inv: "stuck", step: len(r.cmds) - 1, msg: "the job neither runs nor succeeded nor stopped, and no agent is left"}
			}
			return
		}
		if i == limit {
			r.fail = &simViolation{inv: "unquiet", step: len(r.cmds) - 1,
				msg: fmt.Sprintf("not quiet after %d drain steps of %s: %s", limit, step, r.unquiet())}
			return
		}
		if !r.do(fmt.Sprintf("at %s", r.s.now.Add(step).Sub(r.s.t0))) || !r.do("tick") {
			return
		}
	}
}

func (r *simRun) quietNow() bool { return r.unquiet() == "" }

// unquiet says what is still to happen, "" when nothing: the job stopped,
// or every live agent runs the latest round undisturbed, every live node
// has an agent, and no relaunch is wanted.
func (r *simRun) unquiet() string {
	j := r.s.job
	if stopped, _ := j.Stopped(); stopped {
		return ""
	}
	if w := r.wanted(); len(w) > 0 {
		return fmt.Sprintf("rank %d waits for its relaunch", w[0].Rank)
	}
	held := map[string]bool{}
	for _, name := range r.live() {
		p := r.s.pods[name]
		held[p.podName+"/"+r.inc(p)] = true
		switch {
		case p.task != nil || p.round == 0:
			return name + " waits"
		case r.agents[name].restart:
			return name + " restarts"
		}
		if a := j.HeartbeatAnswer(p.podName, r.inc(p), r.rankOf(p), p.round); a.Action != Continue {
			return fmt.Sprintf("%s is told to %s", name, a.Action)
		}
	}
	for _, n := range j.Nodes() {
		if n.State.alive() && n.Exclusion == nil && !held[n.Pod+"/"+n.Incarnation] {
			return fmt.Sprintf("rank %d's pod %s is gone, the master does not know yet", n.Rank, n.Pod)
		}
	}
	return ""
}

// ---- the generator ----

type simGen struct {
	rng  *rand.Rand
	r    *simRun
	n    int // initial pods
	late int
}

// simGenerate runs the history of seed: a random part of about steps
// commands, then the drain. prefix is the random part.
func simGenerate(t testing.TB, seed uint64, steps int) (r *simRun, prefix []string) {
	g := &simGen{rng: rand.New(rand.NewPCG(seed, 0x5111)), r: newSimRun(t)}
	g.r.do(g.config())
	for len(g.r.cmds) < steps && g.r.fail == nil {
		for _, c := range g.next() {
			if !g.r.do(c) {
				break
			}
		}
	}
	prefix = slices.Clone(g.r.cmds)
	g.r.drain()
	return g.r, prefix
}

func (g *simGen) dur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(g.rng.Int64N(int64(hi-lo)/int64(time.Second)+1))*time.Second
}

func (g *simGen) config() string {
	rng := g.rng
	g.n = 2 + rng.IntN(5)
	minN := 1 + rng.IntN(g.n)
	maxN := minN + rng.IntN(g.n-minN+2)
	c := fmt.Sprintf("config min=%d max=%d", minN, maxN)
	if minN >= 2 && rng.IntN(5) == 0 {
		c += " unit=2"
	}
	if rng.IntN(5) == 0 {
		c += fmt.Sprintf(" expected=%d", minN+rng.IntN(maxN-minN+1))
	}
	c += fmt.Sprintf(" waiting=%s heartbeat-timeout=%s join-timeout=%s pend-timeout=%s max-relaunches=%d",
		g.dur(time.Second, 10*time.Second), g.dur(4*time.Second, 30*time.Second), g.dur(30*time.Second, 120*time.Second),
		g.dur(20*time.Second, 90*time.Second), rng.IntN(4))
	if rng.IntN(5) == 0 {
		c += fmt.Sprintf(" check check-timeout=%s", g.dur(5*time.Second, 30*time.Second))
		if rng.IntN(3) == 0 {
			c += " exclude-straggler"
		}
	}
	return c
}

var (
	simAgentCodes = []string{kferrors.CodeHang, kferrors.CodeOOMKilled, kferrors.CodeNonZeroExit, kferrors.CodePreempted, "ValueError"}
	simPodCodes   = []string{kferrors.CodeOOMKilled, kferrors.CodeEvicted, kferrors.CodePreempted, kferrors.CodeNodeLost}
)

// next chooses the next event and returns its commands.
func (g *simGen) next() []string {
	r, rng := g.r, g.rng
	j := r.s.job
	cfg := j.Config()
	hbt := cfg.HeartbeatTimeout
	live := r.live()
	var running, unjoined, silent []string
	for _, name := range live {
		if p := r.s.pods[name]; p.round != 0 && !r.agents[name].restart {
			running = append(running, name)
		}
	}
	for i := range g.n {
		if _, ok := r.agents[fmt.Sprintf("w%d", i)]; !ok {
			unjoined = append(unjoined, fmt.Sprintf("w%d", i))
		}
	}
	// Ranks whose holder died while the master still counts it live.
	for _, n := range j.Nodes() {
		if n.State.alive() && n.Exclusion == nil && !slices.ContainsFunc(live, func(name string) bool {
			p := r.s.pods[name]
			return p.podName == n.Pod && r.inc(p) == n.Incarnation
		}) {
			silent = append(silent, n.Pod+"@"+strconv.Itoa(n.Rank))
		}
	}
	wanted := r.wanted()
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
	type choice struct {
		w  int
		do func() []string
	}
	var cs []choice
	add := func(w int, ok bool, do func() []string) {
		if ok {
			cs = append(cs, choice{w, do})
		}
	}
	add(10, len(unjoined) > 0, func() []string {
		name := pick(unjoined)
		rank, _ := strconv.Atoi(name[1:])
		return []string{simJoin(name, name, rank, 1)}
	})
	add(30, len(live) > 0, func() []string { return []string{r.natural(pick(live))} })
	add(12, true, func() []string {
		d := g.dur(time.Second, max(time.Second, hbt/2))
		if rng.IntN(8) == 0 {
			d = g.dur(hbt, hbt+cfg.JoinTimeout) // the clock jumps
		}
		return []string{fmt.Sprintf("at %s", r.s.now.Add(d).Sub(r.s.t0)), "tick"}
	})
	add(2, len(running) > 0, func() []string { return []string{"leave " + pick(running) + " ok"} })
	add(3, len(live) > 0, func() []string {
		code := pick(simAgentCodes)
		if code == "ValueError" {
			code += " user"
		}
		return []string{"leave " + pick(live) + " " + code}
	})
	add(2, len(live) > 0, func() []string { return []string{"die " + pick(live)} })
	add(2, len(r.names) > 0, func() []string { return []string{"gone " + pick(r.names) + " " + pick(simPodCodes)} })
	add(1, len(r.names) > 0, func() []string { return []string{"notready " + pick(r.names) + " node=n"} })
	add(6, len(wanted) > 0, func() []string {
		n := wanted[rng.IntN(len(wanted))]
		if rng.IntN(2) == 0 {
			return []string{r.newIncarnation(n.Pod, n.Rank)}
		}
		return []string{r.newPod(n.Rank)}
	})
	add(1, len(live) > 0, func() []string { // its container restarts
		p := r.s.pods[pick(live)]
		return []string{"die " + p.name, r.newIncarnation(p.podName, p.rank)}
	})
	add(1, len(live) > 0, func() []string { // a second container under its pod's name
		p := r.s.pods[pick(live)]
		return []string{r.newIncarnation(p.podName, p.rank)}
	})
	add(2, len(silent) > 0, func() []string { // a replacement before the master knows
		pod, rank, _ := strings.Cut(pick(silent), "@")
		k, _ := strconv.Atoi(rank)
		if rng.IntN(2) == 0 {
			return []string{r.newIncarnation(pod, k)}
		}
		return []string{r.newPod(k)}
	})
	add(1, true, func() []string { // a late pod
		g.late++
		rank := -1
		if rng.IntN(2) == 0 {
			rank = rng.IntN(cfg.MaxNodes)
		}
		name := fmt.Sprintf("late%d", g.late)
		return []string{simJoin(name, name, rank, 1)}
	})
	add(1, true, func() []string { return []string{fmt.Sprintf("stall %s", g.dur(time.Second, 3*hbt))} })
	add(1, true, func() []string { return []string{"master-restart"} })
	total := 0
	for _, c := range cs {
		total += c.w
	}
	x := rng.IntN(total)
	for _, c := range cs {
		if x < c.w {
			return c.do()
		}
		x -= c.w
	}
	panic("unreachable")
}
