package storerelay

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/internal/test/mastertest"
	"github.com/kfelastic/kfelastic/master"
)

// States pickled by torch 1.13 (Python 3.11, protocol 4) and torch 2.14
// (Python 3.14, protocol 5): round 3, two participants with heartbeats at
// 22:00:00.123456 and 22:00:10.654321 UTC, a deadline at 21:00, one node
// waiting (agent/storerelay/testdata/c10d). Aged at a 22:00:05 cutoff, only the first
// heartbeat is changed; the deadline stays; the length stays.
func TestAgedC10dState(t *testing.T) {
	files, _ := filepath.Glob("testdata/c10d/state-*.b64")
	if len(files) < 2 {
		t.Fatalf("recorded states: %v", files)
	}
	cutoff := time.Date(2026, 11, 25, 22, 0, 5, 0, time.UTC)
	aged := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			in, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			in = []byte(string(in[:len(in)-1])) // the line's end
			out, n, ok := agedC10dState(in, cutoff, aged)
			if !ok || n != 1 || len(out) != len(in) || string(out) == string(in) {
				t.Fatalf("aged %d heartbeats (ok %t), length %d → %d", n, ok, len(in), len(out))
			}
			// Again: nothing more is before the cutoff but the aged one.
			if _, n, _ := agedC10dState(out, cutoff, aged); n != 1 {
				t.Errorf("second pass aged %d, want the 1 already aged", n)
			}
			if _, n, _ := agedC10dState(in, aged, aged); n != 0 {
				t.Errorf("a cutoff before every heartbeat aged %d", n)
			}
			if before, after, ok := c10dHeartbeats(in, cutoff); !ok || before != 1 || after != 1 {
				t.Errorf("heartbeats before/after the cutoff: %d/%d (ok %t), want 1/1", before, after, ok)
			}
		})
	}
	for _, bad := range []string{"", "not base64!", "eA==", "gASVAAAAAAAAAAD/"} {
		if _, _, ok := agedC10dState([]byte(bad), cutoff, aged); ok {
			t.Errorf("%q: read as a state", bad)
		}
	}
}

// A relay forgets a lost c10d node as soon as the survivors have beaten
// after the cutoff and only as many nodes as the master counted lost are
// still before it: it does not wait for a replacement's torch to beat (it
// imports torch first: 2–3 s on 2.14 here, more on a cluster), nor for the
// keep-alive grace. Without the count it waits for every live node, as
// before. The state is torch 2.14's recorded one (two participants), its
// heartbeats moved to now: a dead node's before the cutoff and a survivor's
// before it, then after it (it re-rendezvoused).
func TestForgetLostAtSurvivorsBeat(t *testing.T) {
	m := mastertest.Start(t, master.Config{JobID: "forget", MinNodes: 1, MaxNodes: 1}, "")
	r := startRelay(t, m.Addr, m.TokenFile)
	in, err := os.ReadFile("testdata/c10d/state-torch2.14.b64")
	if err != nil {
		t.Fatal(err)
	}
	in = in[:len(in)-1]
	now := time.Now()
	cutoff := now.Add(-time.Second)
	// Recorded heartbeats: 2026-11-25 22:00:00.123456 and 22:00:10.654321.
	first, second := time.Date(2026, 11, 25, 22, 0, 5, 0, time.UTC), time.Date(2026, 11, 25, 22, 0, 11, 0, time.UTC)
	stale, _, _ := agedC10dState(in, second, now.Add(-2*time.Second)) // both before the cutoff
	deadOnly, _, _ := agedC10dState(in, first, now.Add(-2*time.Second))
	deadOnly, _, _ = agedC10dState(deadOnly, second, now) // the survivor beat again
	const key = "/torch.rendezvous.forget"
	store := func(v []byte) {
		t.Helper()
		if _, err := r.client.Store(t.Context(), &masterpb.StoreRequest{Client: "test", Seq: uint64(time.Now().UnixNano()),
			Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: key, Value: v}}}); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() string {
		t.Helper()
		res, err := r.client.Store(t.Context(), &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: key}}})
		if err != nil {
			t.Fatal(err)
		}
		return string(res.GetValue())
	}
	r.mu.Lock()
	r.rdzvKeys = map[string]bool{key: true} // as torch's compare_set through the relay marks it
	r.mu.Unlock()

	// The count: live 3 (a replacement that has not beaten), 1 lost.
	store(stale)
	done := make(chan int, 1)
	go func() { done <- r.ForgetLost(t.Context(), Cutoffs{Learnt: cutoff}, 3, 1) }()
	select {
	case n := <-done:
		t.Fatalf("forgot %d while both nodes were before the cutoff", n)
	case <-time.After(500 * time.Millisecond):
	}
	if stored() != string(stale) {
		t.Fatal("the state changed while both nodes were before the cutoff")
	}
	store(deadOnly)
	select {
	case n := <-done:
		want, _, _ := agedC10dState(deadOnly, cutoff, agedHeartbeat)
		if n != 1 || stored() != string(want) {
			t.Errorf("forgot %d nodes, state aged as expected: %t; want the dead one", n, stored() == string(want))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the dead node was not forgotten once the survivor beat")
	}

	// Without the count the replacement must beat too (or the grace pass).
	now = time.Now()
	deadOnly, _, _ = agedC10dState(in, first, now.Add(-2*time.Second))
	deadOnly, _, _ = agedC10dState(deadOnly, second, now)
	store(deadOnly)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if n := r.ForgetLost(ctx, Cutoffs{Learnt: now.Add(-time.Second)}, 3, 0); n != 0 || stored() != string(deadOnly) {
		t.Errorf("without the master's count: forgot %d before every live node beat", n)
	}
}

// The master's Departed (the departed pods' earliest reported failure)
// tells a dead node's heartbeat from a survivor's that re-rendezvoused
// before the agent learnt of the new round, which Learnt alone cannot: the
// dead one is forgotten at once. A dying torch agent that beat once more
// after its failure leaves Learnt's rule in charge.
func TestLostCutoff(t *testing.T) {
	in, err := os.ReadFile("testdata/c10d/state-torch2.14.b64")
	if err != nil {
		t.Fatal(err)
	}
	in = in[:len(in)-1]
	now := time.Now()
	// Recorded heartbeats: 2026-11-25 22:00:00.123456 and 22:00:10.654321.
	first, second := time.Date(2026, 11, 25, 22, 0, 5, 0, time.UTC), time.Date(2026, 11, 25, 22, 0, 11, 0, time.UTC)
	state := func(dead, survivor time.Time) []byte {
		v, _, _ := agedC10dState(in, first, dead)
		v, _, _ = agedC10dState(v, second, survivor)
		return v
	}
	learnt, departed := now.Add(-time.Second), now.Add(-3*time.Second)
	for _, c := range []struct {
		name           string
		dead, survivor time.Time
		at             Cutoffs
		lost           int
		want           time.Time
		ok             bool
	}{
		{"survivor re-rendezvoused before the agent learnt", now.Add(-4 * time.Second), now.Add(-2 * time.Second), Cutoffs{learnt, departed}, 1, departed, true},
		{"the same without Departed: wait", now.Add(-4 * time.Second), now.Add(-2 * time.Second), Cutoffs{Learnt: learnt}, 1, time.Time{}, false},
		{"survivor not yet re-rendezvoused: wait", now.Add(-4 * time.Second), now.Add(-5 * time.Second), Cutoffs{learnt, departed}, 1, time.Time{}, false},
		{"the dying node beat after its failure: Learnt's rule", now.Add(-2 * time.Second), now.Add(-500 * time.Millisecond), Cutoffs{learnt, departed}, 1, learnt, true},
		{"survivor beat after Learnt: Learnt", now.Add(-4 * time.Second), now.Add(-500 * time.Millisecond), Cutoffs{Learnt: learnt}, 1, learnt, true},
		{"a scale-up: nothing lost, nothing before", now.Add(-500 * time.Millisecond), now.Add(-500 * time.Millisecond), Cutoffs{learnt, departed}, 0, time.Time{}, true},
	} {
		got, ok := lostCutoff(state(c.dead, c.survivor), c.at, 3, c.lost)
		if ok != c.ok || !got.Equal(c.want) {
			t.Errorf("%s: cutoff %v (ok %t), want %v (ok %t)", c.name, got, ok, c.want, c.ok)
		}
	}
}
