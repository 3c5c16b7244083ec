package local

import (
	"slices"
	"testing"
)

func names(ps []*Pod) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// Pods are named as the training operator names them; with fewer slots
// than pods the rest wait pending until a slot frees; a relaunch takes the
// next index and keeps the rank.
func TestBook(t *testing.T) {
	b := NewBook("job", 4, 3, 1<<30)
	if got := names(b.Schedule()); !slices.Equal(got, []string{"job-worker-0", "job-worker-1", "job-worker-2"}) {
		t.Fatalf("first schedule: %v", got)
	}
	if got := b.Schedule(); len(got) != 0 {
		t.Fatalf("no slot free, yet started %v", names(got))
	}
	if p := b.Pod("job-worker-3"); p.State != Pending || p.Rank != 3 {
		t.Fatalf("4th pod: %+v", p)
	}
	b.AddSlot()
	if got := names(b.Schedule()); !slices.Equal(got, []string{"job-worker-3"}) {
		t.Fatalf("after add-slot: %v", got)
	}

	// Rank 1's pod is deleted: its replacement is job-worker-4, rank 1,
	// with the memory it is given; carrying the decision twice adds one.
	b.Exited("job-worker-1")
	r := b.Relaunch(1, 2<<30)
	if again := b.Relaunch(1, 2<<30); again != r {
		t.Fatalf("relaunch not idempotent: %s then %s", r.Name, again.Name)
	}
	if r.Name != "job-worker-4" || r.Rank != 1 || r.Memory != 2<<30 || r.Replaces != "job-worker-1" || r.State != Pending {
		t.Fatalf("replacement: %+v", r)
	}
	if got := names(b.Schedule()); !slices.Equal(got, []string{"job-worker-4"}) {
		t.Fatalf("replacement not started: %v", got)
	}
	if b.Current(1) != r {
		t.Fatalf("current of rank 1: %+v", b.Current(1))
	}

	// Slots full (4 running of 4): a second replacement waits.
	b.Exited("job-worker-2")
	b.AddSlot() // 5 slots, 3 running
	b.Relaunch(2, 1<<30)
	if got := names(b.Schedule()); !slices.Equal(got, []string{"job-worker-5"}) {
		t.Fatalf("rank 2's replacement: %v", got)
	}
	if b.Done() {
		t.Fatal("done with pods running")
	}
	for _, p := range b.Pods() {
		b.Exited(p.Name)
	}
	if !b.Done() {
		t.Fatal("not done after every pod exited")
	}
}

// A pod waiting for a slot is not started once the slot frees if the job
// dropped it.
func TestBookDrop(t *testing.T) {
	b := NewBook("j", 2, 1, 0)
	b.Schedule()
	b.Drop("j-worker-1")
	b.Exited("j-worker-0")
	if got := b.Schedule(); len(got) != 0 || !b.Done() {
		t.Fatalf("dropped pod started: %v", names(got))
	}
}
