package local

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

// TensorFlow parameter-server jobs (docs/DESIGN.md §6.3; scenarios 8–10 of §8), as the
// Kubeflow training operator runs a TFJob: one pod per replica, named
// <job>-<type>-<index> (chief, ps, worker), each with TF_CONFIG naming every
// replica's address and its own task. A failed or deleted pod is recreated
// with the SAME name and index (the operator fills the missing index of
// its replica set; the replica's Service keeps its address, so the others
// find it again). The relaunch policy is the master's (relaunch.Policy:
// preemptions not counted, OOM kills get twice the memory), applied here
// because TF replicas do not rendezvous with the master: their cluster is
// fixed by TF_CONFIG.
//
// Each pod still runs under `kfelastic agent` (static single-node, one
// process, exec'd: no fork server): the agent is what writes the pod's error document (the root
// cause at the end, the code the relaunch policy reads), restarts the
// process in place within --max-restarts, turns SIGTERM into a Preempted
// document, and leaves no orphan behind; the torch environment it also sets
// is harmless to a TF process.

// TF is a TensorFlow PS job's shape: one chief, PS parameter servers and
// Workers workers.
type TF struct {
	PS, Workers int
}

// Replicas is the number of pods.
func (t TF) Replicas() int { return 1 + t.PS + t.Workers }

// Rank is the engine's number for replica (type, index), which --chaos
// targets: the chief is 0, ps i is 1+i, worker i is 1+PS+i.
func (t TF) Rank(typ string, index int) int {
	switch typ {
	case "chief":
		return 0
	case "ps":
		return 1 + index
	}
	return 1 + t.PS + index
}

// Task is the replica of rank r.
func (t TF) Task(r int) (typ string, index int) {
	switch {
	case r == 0:
		return "chief", 0
	case r <= t.PS:
		return "ps", r - 1
	}
	return "worker", r - 1 - t.PS
}

// PodName is the training operator's name for a replica.
func (t TF) PodName(job string, r int) string {
	typ, i := t.Task(r)
	return fmt.Sprintf("%s-%s-%d", job, typ, i)
}

// TFConfig is the TF_CONFIG of rank r's pod, given every replica's address
// in rank order, as the operator writes it.
func (t TF) TFConfig(r int, addrs []string) (string, error) {
	cluster := map[string][]string{}
	for q, a := range addrs {
		typ, _ := t.Task(q)
		cluster[typ] = append(cluster[typ], a)
	}
	typ, i := t.Task(r)
	b, err := json.Marshal(map[string]any{"cluster": cluster, "task": map[string]any{"type": typ, "index": i}, "environment": "cloud"})
	return string(b), err
}

// pods is what the engine needs of its pods book: the elastic job's Book
// (a relaunch takes the next index) or a TF job's TFBook (the same name).
type pods interface {
	Schedule() []*Pod
	Exited(name string)
	AddSlot()
	Slots() int
	Relaunch(rank int, memory int64) *Pod
	Current(rank int) *Pod
	Pod(name string) *Pod
	Pods() []Pod
	Done() bool
	Drop(name string)
}

// TFBook is a TF job's pods: one per replica, recreated under the same
// name. It is pure data, like Book; every replica runs at once (a TFJob
// has no elastic minimum to wait in), so there are no slots to wait for.
type TFBook struct {
	pods []*Pod // by rank: the replica's current pod
}

// NewTFBook has one pending pod per replica, each with memory.
func NewTFBook(job string, tf TF, memory int64) *TFBook {
	b := &TFBook{}
	for r := range tf.Replicas() {
		_, i := tf.Task(r)
		b.pods = append(b.pods, &Pod{Name: tf.PodName(job, r), Index: i, Rank: r, Memory: memory, State: Pending})
	}
	return b
}

// Schedule starts every pending pod.
func (b *TFBook) Schedule() []*Pod {
	var out []*Pod
	for _, p := range b.pods {
		if p.State == Pending {
			p.State = Running
			out = append(out, p)
		}
	}
	return out
}

// Exited records that a pod's agent ended.
func (b *TFBook) Exited(name string) {
	if p := b.Pod(name); p != nil {
		p.State = Exited
	}
}

// AddSlot does nothing: every replica has its slot.
func (b *TFBook) AddSlot() {}

// Slots is the number of replicas.
func (b *TFBook) Slots() int { return len(b.pods) }

// Relaunch recreates rank's pod under its name and index with memory
// (idempotent while the pod has not exited).
func (b *TFBook) Relaunch(rank int, memory int64) *Pod {
	p := b.pods[rank]
	if p.State == Exited {
		p.State, p.Memory, p.Replaces = Pending, memory, p.Name
		p.Incarnation++
	}
	return p
}

// Current is rank's pod (nil for a rank the job does not have).
func (b *TFBook) Current(rank int) *Pod {
	if rank < 0 || rank >= len(b.pods) {
		return nil
	}
	return b.pods[rank]
}

// Pods is every replica's pod, in rank order (copies).
func (b *TFBook) Pods() []Pod {
	out := make([]Pod, len(b.pods))
	for i, p := range b.pods {
		out[i] = *p
	}
	return out
}

// Done reports whether no pod is pending or running.
func (b *TFBook) Done() bool {
	return !slices.ContainsFunc(b.pods, func(p *Pod) bool { return p.State != Exited })
}

// Drop takes a pending pod off the book.
func (b *TFBook) Drop(name string) {
	if p := b.Pod(name); p != nil && p.State == Pending {
		p.State = Exited
	}
}

// Pod is the pod of that name, nil if none.
func (b *TFBook) Pod(name string) *Pod {
	for _, p := range b.pods {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// tfOwner decides what becomes of a TF job's pods, as the master does for
// an elastic job's: TF replicas do not rendezvous with the master (their
// cluster is fixed by TF_CONFIG), so the training operator's rules are
// applied here: a failed pod is recreated under its name by the master's
// relaunch policy (relaunch.Policy: preemptions not counted, OOM kills get
// twice the memory), and the job succeeds with its chief. It is pure data
// and numbers its decisions as the master does.
type tfOwner struct {
	TF
	// addrs are the replicas' addresses, by rank: fixed for the job, as
	// each replica's Service keeps its address.
	addrs  []string
	policy relaunch.Policy
	// spent is each rank's counted relaunches.
	spent map[int]int
	seq   int64
	// over: the chief succeeded, the job is done (the operator's success
	// policy); the pods still running are cleaned up, not relaunched.
	over bool
}

func newTFOwner(tf TF, addrs []string, policy relaunch.Policy) *tfOwner {
	return &tfOwner{TF: tf, addrs: addrs, policy: policy, spent: map[int]int{}}
}

// freeLoopbackPorts is n free loopback addresses, one per replica.
func freeLoopbackPorts(n int) ([]string, error) {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, l.Addr().String())
		l.Close()
	}
	return addrs, nil
}

// Exited is the owner's answer to the end of pod p: failure is its failure
// (nil: it succeeded). The chief's success ends the job (over); a failure
// gets a decision (decided), a relaunch or none, unless the job is over.
func (o *tfOwner) Exited(p Pod, failure *kferrors.Failure, now time.Time) (d master.Decision, decided, over bool) {
	if failure == nil {
		if p.Rank == 0 && !o.over {
			o.over = true
			return master.Decision{}, false, true
		}
		return master.Decision{}, false, false
	}
	if o.over {
		return master.Decision{}, false, false
	}
	kind, counted, why := o.policy.Decide(failure.Code, failure.Recoverable, o.spent[p.Rank])
	if counted {
		o.spent[p.Rank]++
	}
	o.seq++
	return master.Decision{Seq: o.seq, Kind: kind, Rank: p.Rank, Pod: p.Name, Reason: failure.Code, Message: why, Counted: counted, Time: now}, true, false
}

// tell gives the Job the owner's answer to the end of pod p, as Exited.
func (o *tfOwner) tell(j *Job, p Pod, failure *kferrors.Failure, now time.Time) {
	d, decided, over := o.Exited(p, failure, now)
	if over {
		j.Over("the chief succeeded: the job is done")
	}
	if decided {
		j.Carry(d, now)
	}
}

// podArgs is the agent's command line and the extra environment of a TF
// pod: a static single-node agent running one process with TF_CONFIG.
func (o *tfOwner) podArgs(opts *Options, p Pod, errURL, logDir string) (args, env []string, err error) {
	cfg, err := o.TFConfig(p.Rank, o.addrs)
	if err != nil {
		return nil, nil, err
	}
	args = []string{"agent", "--nnodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "static", "--rdzv-id", opts.Job,
		"--max-restarts", strconv.Itoa(opts.MaxRestarts), "--error-prefix", errURL, "--log-dir", logDir, "--stop-grace", opts.Grace.String(),
		// A TF process imports no torch: a fork server preloading it would
		// only cost the pod memory (counted against its limit) and time.
		"--fork-server=false"}
	args = append(args, opts.AgentArgs...)
	args = append(append(args, "--"), opts.Command...)
	return args, []string{"TF_CONFIG=" + cfg}, nil
}

// tfFailure is a failed TF pod's failure, for its owner's decision: the
// engine's document, else the one its agent wrote since the pod started (a
// Preempted one after a deletion's SIGTERM, the process's error otherwise),
// else a plain one.
func (e *Engine) tfFailure(p *podProc, end Ending, now time.Time) *kferrors.Failure {
	switch {
	case end.Succeeded:
		return nil
	case end.Document != nil:
		return end.Document
	}
	if doc, ok := e.podDocument(p.pod.Name, p.started); ok {
		return &doc
	}
	return failure("Error", fmt.Sprintf("pod %s failed: %s", p.pod.Name, end.Exit), p.pod.Name, now)
}

// podDocument is the latest error document the agent of pod wrote since.
func (e *Engine) podDocument(pod string, since time.Time) (kferrors.Failure, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, e.errURL, false)
	if err != nil {
		return kferrors.Failure{}, false
	}
	defer b.Close()
	var best kferrors.Failure
	found := false
	iter := b.List(nil)
	for {
		obj, err := iter.Next(ctx)
		if err != nil {
			break
		}
		if !kferrors.IsDocumentKey(obj.Key) || kferrors.PodOfSanitized(kferrors.WorkerFromKey(obj.Key)) != kferrors.SanitizeWorker(pod) {
			continue
		}
		if t, ok := kferrors.TimeFromKey(obj.Key); !ok || t.Before(since) || (found && t.Before(best.Time)) {
			continue
		}
		data, err := kferrors.ReadDocument(ctx, b, obj.Key, kferrors.DefaultMaxDocumentBytes)
		if err != nil {
			continue
		}
		if f, err := kferrors.DecodeFailure(data, kferrors.DefaultMaxDocumentBytes); err == nil {
			best, found = f, true
		}
	}
	return best, found
}
