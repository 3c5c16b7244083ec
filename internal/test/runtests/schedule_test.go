package main

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// Random lists of big and small runs, finishing in random order: the lanes
// are never over-full, every run starts once, none starts while an earlier
// one could have, and a free lane is never left idle while a run may start.
func TestNextKeepsTheLanes(t *testing.T) {
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	for iter := 0; iter < 2000; iter++ {
		runs := make([]run, rng.IntN(12))
		for i := range runs {
			runs[i].Big = rng.IntN(3) == 0
		}
		lanes := 1 + rng.IntN(4)
		bigLanes := 1 + rng.IntN(lanes)
		tailLanes := rng.IntN(5)
		started := make([]bool, len(runs))
		var live []int
		runningBig, count := 0, 0
		for count < len(runs) || len(live) > 0 {
			bigLeft := func() bool {
				for j := range runs {
					if runs[j].Big && (!started[j] || slices.Contains(live, j)) {
						return true
					}
				}
				return false
			}
			for {
				now := lanesNow(runs, started, runningBig, lanes, tailLanes)
				if want := lanes; tailLanes > 0 && !bigLeft() {
					if now != tailLanes {
						t.Fatalf("seed %d iter %d: %d lanes with every big run ended, want %d", seed, iter, now, tailLanes)
					}
				} else if now != want {
					t.Fatalf("seed %d iter %d: %d lanes with a big run left, want %d", seed, iter, now, want)
				}
				i := next(runs, started, len(live), runningBig, now, bigLanes)
				if i < 0 {
					break
				}
				if started[i] {
					t.Fatalf("seed %d iter %d: run %d started twice", seed, iter, i)
				}
				for j := 0; j < i; j++ {
					if !started[j] && !(runs[j].Big && runningBig >= bigLanes) {
						t.Fatalf("seed %d iter %d: run %d started before run %d, which could start", seed, iter, i, j)
					}
				}
				started[i] = true
				count++
				live = append(live, i)
				if runs[i].Big {
					runningBig++
				}
				if len(live) > now || runningBig > bigLanes {
					t.Fatalf("seed %d iter %d: %d running (%d big), lanes %d (%d big)", seed, iter, len(live), runningBig, lanes, bigLanes)
				}
			}
			if len(live) < lanesNow(runs, started, runningBig, lanes, tailLanes) {
				for j := range runs {
					if !started[j] && !(runs[j].Big && runningBig >= bigLanes) {
						t.Fatalf("seed %d iter %d: a lane is free and run %d could start", seed, iter, j)
					}
				}
			}
			if len(live) == 0 {
				if count < len(runs) {
					t.Fatalf("seed %d iter %d: nothing runs and %d runs never started", seed, iter, len(runs)-count)
				}
				break
			}
			k := rng.IntN(len(live))
			if runs[live[k]].Big {
				runningBig--
			}
			live = append(live[:k], live[k+1:]...)
		}
	}
}

// Three lanes, two of them big: the first two big runs at once, a small
// one in the third lane, and the next big one only when a big one ends.
func TestNextHoldsBackTheThirdBig(t *testing.T) {
	runs := []run{{Label: "agent", Big: true}, {Label: "local", Big: true}, {Label: "e2e", Big: true}, {Label: "errors"}, {Label: "events"}}
	started := make([]bool, len(runs))
	var got []string
	running, big := 0, 0
	for {
		i := next(runs, started, running, big, 3, 2)
		if i < 0 {
			break
		}
		started[i] = true
		running++
		if runs[i].Big {
			big++
		}
		got = append(got, runs[i].Label)
	}
	if want := "agent local errors"; strings.Join(got, " ") != want {
		t.Fatalf("started %q, want %q", strings.Join(got, " "), want)
	}
	// agent ends: e2e takes its big lane.
	running, big = running-1, big-1
	if i := next(runs, started, running, big, 3, 2); i < 0 || runs[i].Label != "e2e" {
		t.Fatalf("after agent: next is %d", i)
	}
}
