package master

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// The node health check (docs/DESIGN.md §5.4, DLRover's network check): two rounds
// in which the waiting nodes run a small compute + all-reduce task in
// groups of two (three when their number is odd). Round 1 pairs them in
// rank order; round 2 pairs the fastest with the slowest of round 1, so
// that a node that fails twice, with two partners, is the faulty one, and
// its first partner is cleared. A node is faulty if it failed both rounds,
// a straggler if its best time exceeds StragglerFactor × the median.

// CheckTask is one node's part in one check round.
type CheckTask struct {
	Check      int64
	Round      int // 1 or 2
	Group      int
	GroupRank  int
	GroupSize  int
	LeaderAddr string
	LeaderPort int
	Timeout    time.Duration
}

// CheckReport is a node's result of one check round. Self says a failure
// is the node's own (its check process was killed or crashed, its compute
// failed) rather than its group's: it clears the other members of the
// group of that round's failure, so that one broken node does not take its
// partners down with it (with two nodes, or three in one group, DLRover's
// pairing alone cannot tell them apart).
type CheckReport struct {
	OK      bool
	Self    bool
	Elapsed time.Duration
	// Ready is how long after its launch the node's check reached its
	// group (0: never, or not said); see lateMembers.
	Ready   time.Duration
	Message string
}

type check struct {
	seq      int64
	round    int   // 1 or 2
	number   int64 // DLRover's "Round N", counted over the job
	ranks    []int // participants, rank order
	where    map[int][2]int
	groups   [][]int
	leaders  map[int]NodeInfo // rank → its address at the check's start
	reports  map[int]CheckReport
	first    map[int]CheckReport
	groups1  [][]int
	deadline time.Time
}

func (c *check) participates(rank int) bool {
	_, ok := c.leaders[rank]
	return ok
}

// task is rank's part in the current round, unless it reported already.
func (c *check) task(rank int, timeout time.Duration) (CheckTask, bool) {
	if _, done := c.reports[rank]; done {
		return CheckTask{}, false
	}
	w, ok := c.where[rank]
	if !ok {
		return CheckTask{}, false
	}
	g := c.groups[w[0]]
	leader := c.leaders[g[0]]
	return CheckTask{Check: c.seq, Round: c.round, Group: w[0], GroupRank: w[1], GroupSize: len(g),
		LeaderAddr: leader.Addr, LeaderPort: leader.Port, Timeout: timeout}, true
}

func (c *check) setGroups(groups [][]int) {
	c.groups = groups
	c.where = map[int][2]int{}
	for gi, g := range groups {
		for i, r := range g {
			c.where[r] = [2]int{gi, i}
		}
	}
}

// pairs groups ranks two by two in the given order; an odd last one joins
// the last pair (DLRover does the same), a lone node is a group of one.
func pairs(order []int) [][]int {
	var groups [][]int
	for i := 0; i+1 < len(order); i += 2 {
		groups = append(groups, []int{order[i], order[i+1]})
	}
	if len(order)%2 == 1 {
		last := order[len(order)-1]
		if len(groups) == 0 {
			groups = append(groups, []int{last})
		} else {
			groups[len(groups)-1] = append(groups[len(groups)-1], last)
		}
	}
	return groups
}

// fastWithSlow orders round 2: the fastest of round 1 with the slowest, the
// second fastest with the second slowest, …; nodes that failed round 1 count
// as the slowest, so that each meets a node that passed.
func fastWithSlow(ranks []int, first map[int]CheckReport) [][]int {
	sorted := slices.Clone(ranks)
	slices.SortStableFunc(sorted, func(a, b int) int {
		ra, rb := first[a], first[b]
		if ra.OK != rb.OK {
			if ra.OK {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(ra.Elapsed, rb.Elapsed), cmp.Compare(a, b))
	})
	var groups [][]int
	l, r := 0, len(sorted)-1
	for l < r {
		groups = append(groups, []int{sorted[l], sorted[r]})
		l++
		r--
	}
	if l == r {
		if len(groups) == 0 {
			groups = append(groups, []int{sorted[l]})
		} else {
			groups[len(groups)-1] = append(groups[len(groups)-1], sorted[l])
		}
	}
	return groups
}

func (j *Job) startCheck(w []*Node, now time.Time) {
	c := &check{seq: j.checkRounds/2 + 1, leaders: map[int]NodeInfo{}, first: nil}
	for _, rec := range w {
		c.ranks = append(c.ranks, rec.Rank)
		c.leaders[rec.Rank] = rec.NodeInfo
	}
	j.check = c
	j.startCheckRound(1, pairs(c.ranks), now)
}

func (j *Job) startCheckRound(round int, groups [][]int, now time.Time) {
	c := j.check
	j.checkRounds++
	j.ready.Dirty.Job = true
	c.round = round
	c.number = j.checkRounds
	c.reports = map[int]CheckReport{}
	c.deadline = now.Add(j.cfg.CheckTimeout)
	c.setGroups(groups)
	j.logf("info", "node check round started", "round", c.number, "check_round", round, "groups", j.groupPods(groups))
	for _, r := range c.ranks {
		j.wake(r)
	}
	// Nodes that already left cannot report.
	for _, r := range c.ranks {
		if rec := j.nodes[r]; rec == nil || rec.State != Joining || rec.Exclusion != nil {
			c.reports[r] = CheckReport{Self: true, Message: "the node left during the check"}
		}
	}
	j.maybeFinishCheckRound(now)
}

func (j *Job) groupPods(groups [][]int) string {
	parts := make([]string, len(groups))
	for i, g := range groups {
		names := make([]string, len(g))
		for k, r := range g {
			names[k] = strconv.Itoa(r)
		}
		parts[i] = "[" + strings.Join(names, ", ") + "]"
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// ReportCheck records a node's check result. Reports for another check or
// round than the current one (late or retried) are ignored.
func (j *Job) ReportCheck(n NodeInfo, seq int64, round int, rep CheckReport, now time.Time) error {
	defer j.settle(now)
	rec, err := j.lookup(n)
	if err != nil {
		return err
	}
	rec.LastSeen, rec.LastCall = now, now
	c := j.check
	if c == nil || c.seq != seq || c.round != round || !c.participates(rec.Rank) {
		return nil
	}
	if rep.Elapsed < 0 {
		return fmt.Errorf("%w: negative elapsed time", ErrInvalid)
	}
	if len(rep.Message) > 4096 {
		rep.Message = rep.Message[:4096]
	}
	if _, done := c.reports[rec.Rank]; !done {
		c.reports[rec.Rank] = rep
	}
	j.maybeFinishCheckRound(now)
	return nil
}

// checkReportMissing fails a participant's pending report when it left.
func (j *Job) checkReportMissing(rank int, why string) {
	c := j.check
	if c == nil || !c.participates(rank) {
		return
	}
	if _, done := c.reports[rank]; !done {
		c.reports[rank] = CheckReport{Self: true, Message: "the node left during the check: " + why}
	}
}

func (j *Job) checkTick(now time.Time) {
	c := j.check
	if c == nil || now.Before(c.deadline) {
		return
	}
	for _, r := range c.ranks {
		if _, done := c.reports[r]; !done {
			// Not its own failure: a report late on a loaded node, whose
			// partner broke the round, must still be cleared by it.
			c.reports[r] = CheckReport{Message: fmt.Sprintf("no report within the check timeout %s", j.cfg.CheckTimeout)}
		}
	}
	j.maybeFinishCheckRound(now)
}

// pyDict formats rank → value as Python prints a dict, as DLRover's log
// lines do.
func pyDict(ranks []int, value func(int) string) string {
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = fmt.Sprintf("%d: %s", r, value(r))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

func (j *Job) maybeFinishCheckRound(now time.Time) {
	c := j.check
	if c == nil || len(c.reports) < len(c.ranks) {
		return
	}
	j.logf("info", fmt.Sprintf("Round %d: The node status are %s.", c.number,
		pyDict(c.ranks, func(r int) string { return pyBool(c.reports[r].OK) })), "pods", j.rankPods(c.ranks))
	j.logf("info", fmt.Sprintf("Round %d: The node elapsed time are %s", c.number,
		pyDict(c.ranks, func(r int) string { return strconv.FormatFloat(c.reports[r].Elapsed.Seconds(), 'f', 3, 64) })))
	if c.round == 1 {
		c.first, c.groups1 = c.reports, c.groups
		j.startCheckRound(2, fastWithSlow(c.ranks, c.first), now)
		return
	}
	j.finishCheck(now)
}

func (j *Job) rankPods(ranks []int) string {
	return pyDict(ranks, func(r int) string {
		if rec := j.nodes[r]; rec != nil {
			return "'" + rec.Pod + "'"
		}
		return "None"
	})
}

// CheckVerdict is a node's outcome of both rounds.
type CheckVerdict struct {
	OK        bool
	Best      time.Duration // the best time of a passed round; a late node's best Ready
	Straggler bool
	// Late: each round it did not pass failed because its group waited
	// for it (lateMember): a slow node, not a broken one, and a straggler.
	Late     bool
	Messages []string
}

// LateMargin is how much later than the rest of its group a node must
// reach the group, beyond StragglerFactor × their time, to be charged with
// its group's failure: more than the spread of a loaded machine's torch
// imports, far less than the gloo timeout a late node makes its partners
// wait out.
const LateMargin = 5 * time.Second

// Verdicts classifies the two rounds' reports (pure; DLRover's rules, and
// three of ours): a node failed a round if it reported a failure and no
// member of its group failed by itself or made the group wait for it
// (lateMember) in that round; faulty = failed both rounds, unless it was
// the late member each time (then a straggler); a straggler's best time
// exceeds StragglerFactor × the median of the OTHER passing nodes' best
// times (DLRover's median includes the node itself, so of two nodes
// neither can ever exceed twice their mean; leaving the node out gives the
// same answer from three nodes on and a usable one for two). groups are
// each round's groups.
func Verdicts(ranks []int, rounds [2]map[int]CheckReport, groups [2][][]int) map[int]CheckVerdict {
	out := make(map[int]CheckVerdict, len(ranks))
	var late [2]map[int]time.Duration // late rank → the latest Ready of the rest of its group
	for i := range rounds {
		late[i] = lateMembers(rounds[i], groups[i])
	}
	var times []time.Duration
	for _, r := range ranks {
		v := CheckVerdict{}
		failed, lateRounds := 0, 0
		var lateBest time.Duration
		for i, reports := range rounds {
			rep := reports[r]
			others, isLate := late[i][r]
			switch {
			case rep.OK:
				if !v.OK || rep.Elapsed < v.Best {
					v.Best = rep.Elapsed
				}
				v.OK = true
			case isLate:
				failed++
				lateRounds++
				if lateRounds == 1 || rep.Ready < lateBest {
					lateBest = rep.Ready
				}
				v.Messages = append(v.Messages, fmt.Sprintf("round %d: its group waited for it: ready %.1fs after its check started, the others within %.1fs",
					i+1, rep.Ready.Seconds(), others.Seconds()))
			case !rep.Self && groupmateFailedItself(r, reports, groups[i], late[i]):
				// cleared: its partner broke the round, or made it wait
			default:
				failed++
				if rep.Message != "" {
					v.Messages = append(v.Messages, rep.Message)
				}
			}
		}
		switch {
		case failed == len(rounds) && lateRounds == failed:
			v.OK, v.Late, v.Straggler, v.Best = true, true, true, lateBest
		case failed == len(rounds):
			v.OK = false
		case !v.OK:
			v.OK = true // cleared in every round it failed: not faulty, but no time
		}
		if v.OK && !v.Late && v.Best > 0 {
			times = append(times, v.Best)
		}
		out[r] = v
	}
	if len(times) > 1 {
		for r, v := range out {
			if v.OK && !v.Late && v.Best > 0 && v.Best > StragglerFactor*medianWithout(times, v.Best) {
				v.Straggler = true
				out[r] = v
			}
		}
	}
	return out
}

// lateMembers finds, in each group of a round that failed together (every
// member reported a failure of the group, none its own), the member the
// others waited for: one that reached the group more than StragglerFactor
// × and LateMargin after the last of the others. Their failure (a
// collective timed out waiting for it) is then its doing, which pairing
// alone cannot tell when the whole job is one group of three, or when a
// slow node meets a new partner each round. It maps each late rank to the
// latest Ready of the rest of its group. A member that never reached the
// group failed by itself (nodecheck); one that never reported, or an
// agent too old to say when it was ready, makes nobody stand out: the
// group is left to the pairing.
func lateMembers(reports map[int]CheckReport, groups [][]int) map[int]time.Duration {
	late := map[int]time.Duration{}
	for _, g := range groups {
		if len(g) < 2 {
			continue
		}
		slowest, together := -1, true
		for _, m := range g {
			rep, ok := reports[m]
			if !ok || rep.OK || rep.Self || rep.Ready <= 0 {
				together = false
				break
			}
			if slowest < 0 || rep.Ready > reports[slowest].Ready {
				slowest = m
			}
		}
		if !together {
			continue
		}
		var others time.Duration
		for _, m := range g {
			if m != slowest {
				others = max(others, reports[m].Ready)
			}
		}
		if r := reports[slowest].Ready; r > StragglerFactor*others && r-others >= LateMargin {
			late[slowest] = others
		}
	}
	return late
}

// groupmateFailedItself: another member of rank's group failed by itself
// or was the one the group waited for.
func groupmateFailedItself(rank int, reports map[int]CheckReport, groups [][]int, late map[int]time.Duration) bool {
	for _, g := range groups {
		if !slices.Contains(g, rank) {
			continue
		}
		for _, m := range g {
			_, isLate := late[m]
			if m != rank && !reports[m].OK && (reports[m].Self || isLate) {
				return true
			}
		}
	}
	return false
}

// medianWithout is the median of ts with one occurrence of t left out.
func medianWithout(ts []time.Duration, t time.Duration) time.Duration {
	rest := slices.Clone(ts)
	if i := slices.Index(rest, t); i >= 0 {
		rest = slices.Delete(rest, i, i+1)
	}
	return median(rest)
}

func median(ts []time.Duration) time.Duration {
	if len(ts) == 0 {
		return 0
	}
	s := slices.Clone(ts)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (j *Job) finishCheck(now time.Time) {
	c := j.check
	j.check = nil
	verdicts := Verdicts(c.ranks, [2]map[int]CheckReport{c.first, c.reports}, [2][][]int{c.groups1, c.groups})
	var times []time.Duration
	for _, v := range verdicts {
		if v.OK && !v.Late && v.Best > 0 {
			times = append(times, v.Best)
		}
	}
	med := median(times)
	for _, r := range c.ranks {
		rec := j.nodes[r]
		v := verdicts[r]
		if rec == nil || rec.State != Joining || rec.Exclusion != nil {
			continue
		}
		switch {
		case !v.OK:
			j.logf("warn", "faulty node: it failed both check rounds", "rank", r, "pod", rec.Pod, "host", rec.Host,
				"errors", v.Messages)
			j.takeOut(rec, kferrors.SystemFailure(kferrors.CodeNodeCheckFailed, fmt.Sprintf(
				"pod %s on host %s failed the node health check in both rounds: %s", rec.Pod, hostOr(rec.Host),
				strings.Join(v.Messages, "; ")), rec.Pod, now), now)
		case v.Late && j.cfg.ExcludeStraggler:
			j.logf("warn", "straggler excluded: its check groups waited for it", "rank", r, "pod", rec.Pod, "errors", v.Messages)
			j.takeOut(rec, kferrors.SystemFailure(kferrors.CodeStraggler, fmt.Sprintf(
				"pod %s on host %s is a straggler: its check groups' all-reduce timed out waiting for it (%s)", rec.Pod, hostOr(rec.Host),
				strings.Join(v.Messages, "; ")), rec.Pod, now), now)
		case v.Late:
			j.logf("warn", "straggler found: its check groups waited for it (not excluded: --exclude-straggler is off)",
				"rank", r, "pod", rec.Pod, "errors", v.Messages)
			j.update(rec, func(rec *Node) { rec.Checked = true })
		case v.Straggler && j.cfg.ExcludeStraggler:
			j.logf("warn", "straggler excluded", "rank", r, "pod", rec.Pod, "elapsed", v.Best, "median", med)
			j.takeOut(rec, kferrors.SystemFailure(kferrors.CodeStraggler, fmt.Sprintf(
				"pod %s on host %s is a straggler: its health check took %.3fs, more than %d× the median of the others %.3fs",
				rec.Pod, hostOr(rec.Host), v.Best.Seconds(), StragglerFactor, medianWithout(times, v.Best).Seconds()), rec.Pod, now), now)
		case v.Straggler:
			j.logf("warn", "straggler found (not excluded: --exclude-straggler is off)", "rank", r, "pod", rec.Pod,
				"elapsed", v.Best, "median", med)
			j.update(rec, func(rec *Node) { rec.Checked = true })
		default:
			j.update(rec, func(rec *Node) { rec.Checked = true })
		}
	}
	j.checkViable(now)
	j.tryForm(now)
}

func hostOr(h string) string {
	if h == "" {
		return "(unknown)"
	}
	return h
}
