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
	if p := b.pod(name); p != nil {
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
	if p := b.pod(name); p != nil && p.State == Pending {
		p.State = Exited
	}
}

func (b *TFBook) pod(name string) *Pod {
	for _, p := range b.pods {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// tfJob is the engine's state of a TF job.
type tfJob struct {
	TF
	addrs []string
	// spent is each rank's counted relaunches; started each pod's start
	// (its documents are those written since).
	spent   map[int]int
	started map[string]time.Time
	// incarnations counts each name's pods: a recreated pod gets a cgroup
	// of its own (the old one's is removed in the background).
	incarnations map[string]int
	// over: the chief succeeded, the job is done (the operator's success
	// policy); the pods still running are cleaned up, not relaunched.
	over bool
}

// newTFJob fixes every replica's address: a free loopback port each, kept
// across relaunches as a replica's Service keeps its address.
func newTFJob(tf TF) (*tfJob, error) {
	j := &tfJob{TF: tf, spent: map[int]int{}, started: map[string]time.Time{}, incarnations: map[string]int{}}
	for range tf.Replicas() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		j.addrs = append(j.addrs, l.Addr().String())
		l.Close()
	}
	return j, nil
}

// tfPod is the agent's command line and the extra environment of a TF pod:
// a static single-node agent running one process with TF_CONFIG.
func (e *Engine) tfPod(p Pod, logDir string) (args, env []string, err error) {
	o := &e.opts
	e.tf.started[p.Name] = time.Now()
	cfg, err := e.tf.TFConfig(p.Rank, e.tf.addrs)
	if err != nil {
		return nil, nil, err
	}
	args = []string{"agent", "--nnodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "static", "--rdzv-id", o.Job,
		"--max-restarts", strconv.Itoa(o.MaxRestarts), "--error-prefix", e.errURL, "--log-dir", logDir, "--stop-grace", o.Grace.String(),
		// A TF process imports no torch: a fork server preloading it would
		// only cost the pod memory (counted against its limit) and time.
		"--fork-server=false"}
	args = append(args, o.AgentArgs...)
	args = append(append(args, "--"), o.Command...)
	return args, []string{"TF_CONFIG=" + cfg}, nil
}

// tfExited decides what happens to a TF pod that ended, with the master's
// relaunch policy, and returns the failure to record for it (nil: none).
// A relaunch is left in e.onExit for exited to carry out.
func (e *Engine) tfExited(p *podProc, f *kferrors.Failure, werr error) *kferrors.Failure {
	e.mu.Lock()
	over, cause, started := e.tf.over, p.cause, e.tf.started[p.pod.Name]
	e.mu.Unlock()
	if over && cause == tfCleanup {
		p.exit = "cleaned up"
		return nil
	}
	if werr == nil {
		if p.pod.Rank == 0 {
			e.tfSucceeded()
		}
		return f
	}
	failure := f
	if failure == nil {
		// The agent wrote the pod's document (a Preempted one after a
		// deletion's SIGTERM, the process's error otherwise).
		if doc, ok := e.podDocument(p.pod.Name, started); ok {
			failure = &doc
		} else {
			x := kferrors.SystemFailure("Error", fmt.Sprintf("pod %s failed: %s", p.pod.Name, p.exit), p.pod.Name, time.Now())
			failure = &x
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if over {
		return f
	}
	kind, counted, why := e.relaunchPolicy().Decide(failure.Code, failure.Recoverable, e.tf.spent[p.pod.Rank])
	if counted {
		e.tf.spent[p.pod.Rank]++
	}
	d := master.Decision{Kind: kind, Rank: p.pod.Rank, Pod: p.pod.Name, Reason: failure.Code, Message: why, Counted: counted, Time: time.Now()}
	if kind == relaunch.None {
		e.note("relaunch", "%s is not relaunched after %s: %s", p.pod.Name, failure.Code, why)
		return f
	}
	e.onExit[p.pod.Name] = d
	return f
}

// relaunchPolicy is the job's relaunch policy: the master's, and a TF job's.
func (e *Engine) relaunchPolicy() relaunch.Policy {
	return relaunch.Policy{MaxPerRank: e.opts.MaxRelaunches, OOM: e.policy}
}

// tfCleanup is the cause of a pod stopped because the job is over.
const tfCleanup = "Cleanup"

// tfSucceeded is the operator's success policy for a TFJob with a chief:
// the job succeeded when the chief did; pods still running are deleted
// (cleanPodPolicy Running) after a grace to finish by themselves.
func (e *Engine) tfSucceeded() {
	e.mu.Lock()
	e.tf.over = true
	var left []*podProc
	for _, pp := range e.procs {
		if !isDone(pp) {
			left = append(left, pp)
		}
	}
	e.mu.Unlock()
	e.note("tf", "the chief succeeded: the job is done")
	for _, pp := range left {
		go func() {
			select {
			case <-pp.done:
			case <-time.After(e.opts.Grace):
				e.note("tf", "%s still runs after the chief finished: deleting it", pp.pod.Name)
				e.killPod(pp, tfCleanup)
			}
		}()
	}
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

// cgroupName is the name of a pod's cgroup: its own, or for a TF pod its
// name and incarnation.
func (e *Engine) cgroupName(p Pod) string {
	if e.tf == nil {
		return p.Name
	}
	e.tf.incarnations[p.Name]++
	return fmt.Sprintf("%s.%d", p.Name, e.tf.incarnations[p.Name])
}
