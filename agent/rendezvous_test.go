package agent

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestInProcessRounds(t *testing.T) {
	r := NewInProcess("job", 2, 3, 200*time.Millisecond)
	ctx := t.Context()
	type res struct {
		round Round
		err   error
	}
	join := func(id string, rank int) chan res {
		ch := make(chan res, 1)
		go func() {
			round, err := r.Next(ctx, NodeInfo{ID: id, Rank: rank, LocalWorldSize: 2, Addr: id, Port: 1000 + rank})
			ch <- res{round, err}
		}()
		return ch
	}
	// Two of max three: the round completes after the last call, with both.
	start := time.Now()
	a, b := join("b", 1), join("a", 0)
	ra, rb := <-a, <-b
	if ra.err != nil || rb.err != nil {
		t.Fatal(ra.err, rb.err)
	}
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("round with min nodes completed after %v, before the last call", took)
	}
	if ra.round.Number != 1 || ra.round.GroupWorldSize != 2 || ra.round.GroupRank != 1 || rb.round.GroupRank != 0 ||
		ra.round.MasterAddr != "a" || ra.round.MasterPort != 1000 || ra.round.WorldSize() != 4 || ra.round.FirstGlobalRank() != 2 {
		t.Errorf("rounds %+v %+v", ra.round, rb.round)
	}
	// A third node waiting outdates round 1 for the members.
	changed := make(chan error, 1)
	go func() { changed <- r.Changed(ctx, 1) }()
	select {
	case err := <-changed:
		t.Fatalf("Changed returned %v with nobody waiting", err)
	case <-time.After(50 * time.Millisecond):
	}
	c := join("c", -1)
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
	// The members rejoin: three of three completes at once.
	start = time.Now()
	a, b = join("a", 0), join("b", 1)
	rounds := []Round{(<-a).round, (<-b).round, (<-c).round}
	if took := time.Since(start); took > 150*time.Millisecond {
		t.Errorf("full round took %v", took)
	}
	for i, want := range []int{0, 1, 2} {
		if rounds[i].Number != 2 || rounds[i].GroupRank != want || rounds[i].GroupWorldSize != 3 {
			t.Errorf("round 2, node %d: %+v", i, rounds[i])
		}
	}
}

func TestInProcessCancel(t *testing.T) {
	r := NewInProcess("job", 2, 2, time.Hour)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := r.Next(ctx, NodeInfo{ID: "a", Rank: 0, LocalWorldSize: 1})
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Next after cancel: %v", err)
	}
	// The cancelled node left: a new pair forms a round without it.
	go func() { _, _ = r.Next(t.Context(), NodeInfo{ID: "b", Rank: 1, LocalWorldSize: 1}) }()
	round, err := r.Next(t.Context(), NodeInfo{ID: "c", Rank: 2, LocalWorldSize: 1})
	if err != nil || round.GroupWorldSize != 2 || round.GroupRank != 1 {
		t.Fatalf("round %+v, %v", round, err)
	}
}
