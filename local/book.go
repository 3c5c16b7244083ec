package local

import "fmt"

// PodState is where a pod of the book stands.
type PodState string

const (
	// Pending: waiting for a free slot.
	Pending PodState = "pending"
	// Running: its agent was started.
	Running PodState = "running"
	// Exited: its agent ended (whatever the outcome).
	Exited PodState = "exited"
)

// Pod is one pod of the job as the training operator would name it.
type Pod struct {
	Name string
	// Index is the pod's number in its name; Rank the node rank it holds
	// (a replacement keeps its predecessor's rank, the index moves on).
	Index, Rank int
	// Memory is its memory limit in bytes (0: none).
	Memory int64
	State  PodState
	// Replaces is the pod it was relaunched for ("" for the first ones).
	Replaces string
	// Incarnation counts the pods of this name before it: a TF pod
	// recreated under its name is its next incarnation (and gets a cgroup
	// of its own while the old one's is removed).
	Incarnation int
}

// Book is the pods of one job and the slots they run in, as the training
// operator and the scheduler keep them: pure data, no processes. Pods are
// `<job>-worker-<i>`; a relaunch takes the next free index and keeps the
// rank; pods wait pending while every slot is taken.
type Book struct {
	job   string
	slots int
	next  int
	pods  []*Pod
}

// NewBook has one pending pod per rank 0..maxNodes-1, each with memory,
// and slots slots to run them in.
func NewBook(job string, maxNodes, slots int, memory int64) *Book {
	b := &Book{job: job, slots: slots}
	for r := range maxNodes {
		b.add(r, memory, "")
	}
	return b
}

func (b *Book) add(rank int, memory int64, replaces string) *Pod {
	p := &Pod{Name: fmt.Sprintf("%s-worker-%d", b.job, b.next), Index: b.next, Rank: rank, Memory: memory, State: Pending, Replaces: replaces}
	b.next++
	b.pods = append(b.pods, p)
	return p
}

// Schedule moves pending pods into free slots, lowest index first, and
// returns them (now Running): the caller starts their agents.
func (b *Book) Schedule() []*Pod {
	free := b.slots - b.count(Running)
	var started []*Pod
	for _, p := range b.pods {
		if free <= 0 {
			break
		}
		if p.State == Pending {
			p.State = Running
			started = append(started, p)
			free--
		}
	}
	return started
}

func (b *Book) count(s PodState) int {
	n := 0
	for _, p := range b.pods {
		if p.State == s {
			n++
		}
	}
	return n
}

// Exited records that a pod's agent ended; its slot is free.
func (b *Book) Exited(name string) {
	if p := b.Pod(name); p != nil {
		p.State = Exited
	}
}

// AddSlot frees one more slot (a node joins the cluster).
func (b *Book) AddSlot() { b.slots++ }

// Slots is the number of slots.
func (b *Book) Slots() int { return b.slots }

// Relaunch adds a pending replacement for rank, with memory, and returns
// it. It is idempotent: while the rank has a pod that is not Exited, that
// pod is returned and nothing is added (a decision carried twice).
func (b *Book) Relaunch(rank int, memory int64) *Pod {
	var last *Pod
	for _, p := range b.pods {
		if p.Rank == rank {
			last = p
		}
	}
	if last != nil && last.State != Exited {
		return last
	}
	replaces := ""
	if last != nil {
		replaces = last.Name
	}
	return b.add(rank, memory, replaces)
}

// Pod is the pod of that name, nil if none.
func (b *Book) Pod(name string) *Pod {
	for _, p := range b.pods {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Current is the latest pod of rank (nil if the rank never had one).
func (b *Book) Current(rank int) *Pod {
	var last *Pod
	for _, p := range b.pods {
		if p.Rank == rank {
			last = p
		}
	}
	return last
}

// Pods is every pod so far, in index order (copies).
func (b *Book) Pods() []Pod {
	out := make([]Pod, len(b.pods))
	for i, p := range b.pods {
		out[i] = *p
	}
	return out
}

// Done reports whether no pod is pending or running.
func (b *Book) Done() bool { return b.count(Pending) == 0 && b.count(Running) == 0 }

// Drop takes a pending pod off the book (the job stopped before it ran).
func (b *Book) Drop(name string) {
	if p := b.Pod(name); p != nil && p.State == Pending {
		p.State = Exited
	}
}
