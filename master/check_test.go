package master

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var checkSeeds = flag.Int("check.n", 3000, "node-check histories TestCheckNamesOnlyTheSlowNode runs")

// TestCheckNamesOnlyTheSlowNode runs the node check's two rounds (the
// master's own pairing: pairs, then fastWithSlow) over a model of a job's
// nodes, seeded: each node reaches its group after its interpreter start,
// torch's import and the compute, a loaded machine's spread; one node, in
// most histories, is throttled to a tenth of a CPU, so it gets there ten
// times later and computes ten times slower. A group whose members reach
// it further apart than the collective's timeout fails together, as gloo
// does (every member reports the group's failure, none its own);
// otherwise every member passes with its own compute and the all-reduce.
// Whatever the timing, the verdicts name the throttled node and only it
// (a straggler, or faulty where one round's timing fell within
// LateMargin), and a job without one has no straggler and no faulty node.
func TestCheckNamesOnlyTheSlowNode(t *testing.T) {
	faulty := 0
	defer func() {
		t.Logf("%d histories; the slow node named faulty rather than a straggler in %d", *checkSeeds, faulty)
	}()
	for seed := range uint64(*checkSeeds) {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		n := 2 + rng.IntN(7)
		slow := -1
		if rng.IntN(8) != 0 {
			slow = rng.IntN(n)
		}
		timeout := time.Duration(5+rng.IntN(36)) * time.Second
		ready := make([]time.Duration, n)
		compute := make([]time.Duration, n)
		for r := range n {
			ready[r] = time.Duration(800+rng.IntN(2200)) * time.Millisecond
			// Healthy nodes within 1.6× of each other: the straggler rule
			// (2× the median) presumes no more.
			compute[r] = time.Duration(40+rng.IntN(15)) * time.Millisecond
			if r == slow {
				ready[r] *= 10
				compute[r] *= 10
			}
		}
		round := func(groups [][]int) map[int]CheckReport {
			reports := map[int]CheckReport{}
			for _, g := range groups {
				first, last := ready[g[0]], ready[g[0]]
				for _, m := range g {
					first, last = min(first, ready[m]), max(last, ready[m])
				}
				for _, m := range g {
					// Each round starts a fresh check process: its jitter.
					rd := ready[m] + time.Duration(rng.IntN(200))*time.Millisecond
					if len(g) > 1 && last-first > timeout {
						reports[m] = CheckReport{Ready: rd, Message: "torch check: all-reduce with the group failed: Socket Timeout"}
						continue
					}
					reports[m] = CheckReport{OK: true, Ready: rd,
						Elapsed: compute[m] + time.Duration(5+rng.IntN(10))*time.Millisecond}
				}
			}
			return reports
		}
		ranks := make([]int, n)
		for r := range ranks {
			ranks[r] = r
		}
		g1 := pairs(ranks)
		first := round(g1)
		g2 := fastWithSlow(ranks, first)
		second := round(g2)
		verdicts := Verdicts(ranks, [2]map[int]CheckReport{first, second}, [2][][]int{g1, g2})
		for r, v := range verdicts {
			named := !v.OK || v.Straggler
			if named != (r == slow) {
				t.Fatalf("seed %d (go test -run TestCheckNamesOnlyTheSlowNode -check.n %d, the last one): %d nodes, "+
					"slow %d, timeout %s, ready %v, compute %v\nround 1 %v: %v\nround 2 %v: %v\nrank %d: %+v",
					seed, seed+1, n, slow, timeout, ready, compute, g1, first, g2, second, r, v)
			}
			if r == slow && !v.OK {
				// Named, as faulty: one round timed out with it less
				// than LateMargin behind the others, the other did not.
				faulty++
			}
		}
	}
}

// TestLateMemberNeedsAWholeGroupFailure: the member a group waited for is
// found only when every member reported the group's failure and said when
// it was ready; a failure of its own, a passing member, or an old agent
// that does not say leaves the group to DLRover's pairing.
func TestLateMemberNeedsAWholeGroupFailure(t *testing.T) {
	s := time.Second
	fail := func(ready time.Duration) CheckReport { return CheckReport{Ready: ready, Message: "timeout"} }
	for _, tc := range []struct {
		name    string
		reports map[int]CheckReport
		want    string
	}{
		{"the slow one", map[int]CheckReport{0: fail(1 * s), 1: fail(2 * s), 2: fail(30 * s)}, "map[2:2s]"},
		{"within the margin", map[int]CheckReport{0: fail(1 * s), 1: fail(2 * s), 2: fail(6 * s)}, "map[]"},
		{"within the factor", map[int]CheckReport{0: fail(10 * s), 1: fail(12 * s), 2: fail(20 * s)}, "map[]"},
		{"one passed", map[int]CheckReport{0: fail(1 * s), 1: {OK: true, Ready: s}, 2: fail(30 * s)}, "map[]"},
		{"one failed itself", map[int]CheckReport{0: fail(1 * s), 1: {Self: true}, 2: fail(30 * s)}, "map[]"},
		{"an old agent", map[int]CheckReport{0: fail(1 * s), 1: fail(0), 2: fail(30 * s)}, "map[]"},
		{"no report", map[int]CheckReport{0: fail(1 * s), 2: fail(30 * s)}, "map[]"},
	} {
		if got := fmt.Sprint(lateMembers(tc.reports, [][]int{{0, 1, 2}})); got != tc.want {
			t.Errorf("%s: late %s, want %s", tc.name, got, tc.want)
		}
	}
}
