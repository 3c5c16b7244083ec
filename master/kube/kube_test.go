package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/kfoperator"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The simulated nodes (kubeenv.StartSimNodes) pods are bound to, in this
// order of preference.
var nodes = []string{"sim-node-a", "sim-node-b"}

// TestOwnerWithTrainingOperator carries out decisions against the real
// kube-apiserver, the real Kubeflow training operator (which recreates
// deleted and failed pods from the current template) and simulated nodes
// (kubeenv.StartSimNodes: their kubelets in the test; the test binds pods as a scheduler would, honouring
// hostname affinity). Every Owner runs with a token of the service account
// kfoperator.MasterObjects creates, so each case also proves that the Role
// the plugin grants is enough.
func TestOwnerWithTrainingOperator(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver, and the training operator (scripts/deps.sh k8s); skipped under -short")
	}
	cfg := kubeenv.Kube(t)
	kubeenv.StartOperator(t, cfg)
	kubeenv.StartSimNodes(t, cfg, nodes...)

	t.Run("OOMKilledWorkerComesBackWithTwiceTheMemory", func(t *testing.T) {
		e := newJobEnv(t, cfg, "oom")
		e.watch(t)
		worker0 := e.waitRunning(t, "worker-0", "")
		old := e.waitRunning(t, "worker-1", "")
		e.setStatus(t, "worker-1", exited(137, "OOMKilled"))
		g := e.waitGone(t, "worker-1", kferrors.CodeOOMKilled)
		if g.UID != string(old.UID) || !g.Recoverable || g.Node != nodes[0] || g.Index != 1 {
			t.Errorf("report %+v", g)
		}
		if err := e.owner.Carry(e.ctx, Action{Seq: 1, Kind: relaunch.MoreMemory, Rank: 1, Pod: e.name("worker-1"), UID: g.UID,
			Reason: g.Code, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
		p := e.waitPod(t, "worker-1", "a Running pod with a 2Gi limit", func(p *corev1.Pod) bool {
			l := limit(p)
			return p.Status.Phase == corev1.PodRunning && l.Cmp(resource.MustParse("2Gi")) == 0
		})
		if req := p.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory]; req.Cmp(resource.MustParse("1Gi")) != 0 {
			t.Errorf("request %s, want 1Gi (512Mi doubled)", req.String())
		}
		if l, r := e.templateMemory(t); l != "2Gi" || r != "1Gi" {
			t.Errorf("job template: limit %s request %s, want 2Gi 1Gi", l, r)
		}
		if now := e.pod(t, "worker-0"); now == nil || now.UID != worker0.UID {
			t.Error("worker-0 was replaced; only worker-1 was OOM-killed")
		}
		e.noReport(t, kferrors.CodePreempted) // deleting the stale replacement is ours, not a preemption
	})

	t.Run("FaultyNodeReplacementAvoidsItsHost", func(t *testing.T) {
		e := newJobEnv(t, cfg, "avoid")
		e.watch(t)
		w0, w1 := e.bothOnFirstNode(t)
		// The agent names the node; the owner checks it against the pod.
		if err := e.owner.Carry(e.ctx, Action{Seq: 1, Kind: relaunch.AvoidHost, Pod: e.name("worker-0"), Host: nodes[0],
			UID: string(w0.UID), Reason: "NodeCheckFailed", Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
		p := e.waitRunning(t, "worker-0", w0.UID)
		if p.Spec.NodeName != nodes[1] || !avoids(p, nodes[0]) {
			t.Errorf("replacement on %s with affinity %+v", p.Spec.NodeName, p.Spec.Affinity)
		}
		// A second faulty pod on the same host, no host named and no UID:
		// the owner finds the node from the pod; the host is listed once.
		if err := e.owner.Carry(e.ctx, Action{Seq: 2, Kind: relaunch.AvoidHost, Pod: e.name("worker-1"),
			Reason: "Straggler", Time: time.Now().Add(time.Second)}); err != nil {
			t.Fatal(err)
		}
		p = e.waitRunning(t, "worker-1", w1.UID)
		if p.Spec.NodeName != nodes[1] || !avoids(p, nodes[0]) {
			t.Errorf("replacement on %s with affinity %+v", p.Spec.NodeName, p.Spec.Affinity)
		}
		job := e.job(t)
		aff := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker].Template.Spec.Affinity
		terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || strings.Join(terms[0].MatchExpressions[0].Values, ",") != nodes[0] {
			t.Errorf("template affinity %+v", terms)
		}
	})

	// Issue 31: a GPU health daemon's Warning event on a pod (created here
	// as the daemon would) reaches the master as that pod's fault, with the
	// pod's node; the master's decision (the policy's: another node) puts
	// the replacement on the other node; the same event again, the old
	// pod's events after its replacement, other reasons and free text
	// posing as the daemon's change nothing. The owner runs with the
	// master's Role: list and watch on events are enough.
	t.Run("GPUFaultEventTakesThePodOffItsNode", func(t *testing.T) {
		e := newJobEnv(t, cfg, "gpu")
		e.watch(t)
		w1 := e.waitRunning(t, "worker-1", "")
		faults := make(chan GPUFault, 16)
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan error, 1)
		go func() { done <- e.owner.WatchPodWarnings(ctx, PodWarnings{GPUFault: func(g GPUFault) { faults <- g }}) }()
		defer func() { cancel(); <-done }()
		msg := "[gpu-health] [CRITICAL] Xid 79 (GPU has fallen off the bus) on GPU 3 GPU-1a2b. xid=79 severity=critical gpu_uuid=GPU-1a2b gpu_index=3 pci=0000:3b:00.0"
		e.gpuEvent(t, w1, "BackOff", msg)
		e.gpuEvent(t, w1, kferrors.EventReasonXid, "GPU has fallen off the bus xid=79")
		at := time.Now().Add(-2 * time.Second).Truncate(time.Second)
		ev := e.gpuEventAt(t, w1, kferrors.EventReasonXid, msg, at)
		var g GPUFault
		select {
		case g = <-faults:
		case <-time.After(20 * time.Second):
			t.Fatal("no fault reported")
		}
		f, ok := g.Failure()
		if g.Pod != w1.Name || g.UID != string(w1.UID) || g.Node != nodes[0] || !g.At.Equal(at) || !ok ||
			f.Code != kferrors.CodeGpuFallenOffBus || !strings.Contains(f.Message, "on node "+nodes[0]) {
			t.Fatalf("fault %+v, failure %+v", g, f)
		}
		kind, counted, _ := relaunch.DefaultPolicy.Decide(f.Code, f.Recoverable, 0)
		if err := e.owner.Carry(e.ctx, Action{Seq: 1, Kind: kind, Pod: w1.Name, UID: g.UID, Reason: f.Code, Time: time.Now()}); err != nil || counted {
			t.Fatalf("carry %s (counted %v): %v", kind, counted, err)
		}
		p := e.waitRunning(t, "worker-1", w1.UID)
		if p.Spec.NodeName != nodes[1] || !avoids(p, nodes[0]) {
			t.Errorf("replacement on %s with affinity %+v", p.Spec.NodeName, p.Spec.Affinity)
		}
		// The old pod's event again (a series' count: a new occurrence, but
		// of a pod already replaced) and a late new one of the old pod.
		ev.Count++
		if err := e.admin.Update(e.ctx, ev); err != nil {
			t.Fatal(err)
		}
		e.gpuEvent(t, w1, kferrors.EventReasonXid, msg)
		select {
		case g := <-faults:
			t.Errorf("a fault reported again or of a replaced pod: %+v", g)
		case <-time.After(3 * time.Second):
		}
	})

	// Issue 31: the node controller's NodeNotReady on a pod (recorded here
	// as kube-controller-manager's MarkPodsNotReady does) reaches the
	// master with the pod's node, from the master's Role: the node's own
	// condition is read only once a ClusterRole grants get on nodes (the
	// simulated node is Ready: the read is what is tested). The same reason from
	// another source changes nothing; the controller recording it again on
	// the same event (count up, a later time: the node not ready again) is
	// reported again, dated by its latest time, and an update that does not
	// count is not.
	t.Run("NodeNotReadyEventNamesThePodsNode", func(t *testing.T) {
		e := newJobEnv(t, cfg, "notready")
		e.watch(t)
		w1 := e.waitRunning(t, "worker-1", "")
		watch := func(o *Owner) (chan NodeNotReady, func()) {
			got := make(chan NodeNotReady, 16)
			ctx, cancel := context.WithCancel(e.ctx)
			done := make(chan error, 1)
			go func() { done <- o.WatchPodWarnings(ctx, PodWarnings{NodeNotReady: func(n NodeNotReady) { got <- n }}) }()
			return got, func() { cancel(); <-done }
		}
		next := func(got chan NodeNotReady) NodeNotReady {
			t.Helper()
			select {
			case n := <-got:
				return n
			case <-time.After(20 * time.Second):
				t.Fatal("no NodeNotReady reported")
				return NodeNotReady{}
			}
		}
		got, stop := watch(e.owner)
		e.warningEvent(t, w1, "someone", "NodeNotReady", "Node is not ready", time.Now())
		at := time.Now().Add(-time.Second).Truncate(time.Second)
		ev := e.warningEvent(t, w1, "node-controller", "NodeNotReady", "Node is not ready", at)
		n := next(got)
		if n.Pod != w1.Name || n.UID != string(w1.UID) || n.Node != nodes[0] || !n.At.Equal(at) || n.Condition != "" {
			t.Fatalf("report %+v, want pod %s on %s at %s with no condition (the Role does not grant nodes)", n, w1.Name, nodes[0], at)
		}
		again := at.Add(time.Second)
		ev.Count, ev.LastTimestamp = 2, metav1.NewTime(again)
		if err := e.admin.Update(e.ctx, ev); err != nil {
			t.Fatal(err)
		}
		if n := next(got); n.Pod != w1.Name || !n.At.Equal(again) {
			t.Errorf("the event recorded again: %+v, want %s at %s", n, w1.Name, again)
		}
		ev.Annotations = map[string]string{"example.com/seen-by": "another-reader"}
		if err := e.admin.Update(e.ctx, ev); err != nil {
			t.Fatal(err)
		}
		select {
		case n := <-got:
			t.Errorf("reported again or from another source: %+v", n)
		case <-time.After(2 * time.Second):
		}
		stop()

		e.grantNodes(t, "get") // as the log asks
		got, stop = watch(e.newOwner(t, relaunch.OOM{}))
		defer stop()
		n = next(got) // the event above, listed again by a new owner
		if !strings.HasPrefix(n.Condition, "Ready=True (") {
			t.Errorf("condition %q, want the simulated node's Ready condition", n.Condition)
		}
	})

	// Issue 31: a GPU fault a daemon records against a node (in "default",
	// where the API server keeps the events of cluster objects) reaches the
	// master as a fault of the job's pods on that node: the pod the event
	// names, else every one there. Without a Role in "default" the owner
	// says so once and the pods' own events still reach it; a fault dated
	// before the pods came, one naming another namespace's pod and one on
	// a node without the job's pods change nothing.
	t.Run("GPUFaultEventOnTheNodeNamesItsPods", func(t *testing.T) {
		e := newJobEnv(t, cfg, "nodegpu")
		e.watch(t)
		w0, w1 := e.bothOnFirstNode(t)
		watch := func() (chan GPUFault, func()) {
			o, err := New(Config{Host: e.rest.Host, CAData: e.rest.CAData, BearerToken: e.token, Namespace: e.ns, Job: e.job0,
				Logger: e.logger, NodeEventNamespace: metav1.NamespaceDefault})
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan GPUFault, 16)
			ctx, cancel := context.WithCancel(e.ctx)
			done := make(chan error, 1)
			go func() { done <- o.WatchPodWarnings(ctx, PodWarnings{GPUFault: func(g GPUFault) { got <- g }}) }()
			return got, func() { cancel(); <-done }
		}
		faults := func(got chan GPUFault, n int) []GPUFault {
			t.Helper()
			var l []GPUFault
			for len(l) < n {
				select {
				case g := <-got:
					l = append(l, g)
				case <-time.After(20 * time.Second):
					t.Fatalf("%d faults reported (%+v), want %d", len(l), l, n)
				}
			}
			select {
			case g := <-got:
				t.Fatalf("a fault more than the %d wanted: %+v (before it: %+v)", n, g, l)
			case <-time.After(2 * time.Second):
			}
			slices.SortFunc(l, func(a, b GPUFault) int { return strings.Compare(a.Pod+a.EventUID, b.Pod+b.EventUID) })
			return l
		}
		tail := " severity=critical gpu_index=2 gpu_uuid=GPU-77"
		xid79 := "[gpu-health] [CRITICAL] Xid 79 (GPU has fallen off the bus) on GPU 2 GPU-77. xid=79" + tail

		// The master's Role alone: the node's events are not read, the
		// pods' are.
		got, stop := watch()
		e.nodeEvent(t, nodes[0], xid79+" pod="+w1.Name+" namespace="+e.ns, time.Now())
		e.gpuEvent(t, w0, kferrors.EventReasonXid, xid79)
		if l := faults(got, 1); l[0].Pod != w0.Name {
			t.Fatalf("without a Role in default: %+v, want only the pod event's fault of %s", l, w0.Name)
		}
		stop()

		e.grantNodeEvents(t)
		got, stop = watch()
		defer stop()
		l := faults(got, 2) // the node event above and the pod event, listed
		if l[0].Pod != w0.Name || l[1].Pod != w1.Name || l[1].Node != nodes[0] || l[1].UID != string(w1.UID) ||
			!strings.HasSuffix(l[1].EventUID, "/"+string(w1.UID)) {
			t.Fatalf("faults %+v, want %s's (pod event) then %s's (node event naming it)", l, w0.Name, w1.Name)
		}
		if f, ok := l[1].Failure(); !ok || f.Code != kferrors.CodeGpuFallenOffBus || !strings.Contains(f.Message, "on node "+nodes[0]) {
			t.Errorf("failure %+v", f)
		}

		// Not the job's: another namespace's pod, another node, a fault
		// before the pods came.
		e.nodeEvent(t, nodes[0], xid79+" pod="+w1.Name+" namespace=elsewhere", time.Now())
		e.nodeEvent(t, nodes[1], xid79, time.Now())
		old := e.nodeEvent(t, nodes[0], xid79, w0.CreationTimestamp.Add(-time.Hour))
		// An NVSwitch fault names no pod: every pod of the job on the node.
		at := time.Now().Add(-time.Second).Truncate(time.Second)
		e.nodeEvent(t, nodes[0], "[gpu-health] [CRITICAL] SXid 12028 on NVSwitch 0000:c3:00.0. sxid=12028 severity=critical pci=0000:c3:00.0", at)
		l = faults(got, 2)
		for i, p := range []*corev1.Pod{w0, w1} {
			f, _ := l[i].Failure()
			if l[i].Pod != p.Name || !l[i].At.Equal(at) || f.Code != kferrors.CodeGpuNvlinkError {
				t.Errorf("SXid on the node: fault %+v (%s), want %s's at %s", l[i], f.Code, p.Name, at)
			}
		}

		// The daemon sees the old fault again and records it on the same
		// event, as client-go's correlator does (count 2, a later
		// lastTimestamp): it recurred while the pods are there, so both
		// take it. An update that does not count again changes nothing.
		again := time.Now().Add(-time.Second).Truncate(time.Second)
		old.Count, old.LastTimestamp = 2, metav1.NewTime(again)
		if err := e.admin.Update(e.ctx, old); err != nil {
			t.Fatal(err)
		}
		l = faults(got, 2)
		for i, p := range []*corev1.Pod{w0, w1} {
			if l[i].Pod != p.Name || !l[i].At.Equal(again) || !strings.HasPrefix(l[i].EventUID, string(old.UID)+"/") {
				t.Errorf("the old fault recurring: %+v, want %s's at %s", l[i], p.Name, again)
			}
		}
		old.Annotations = map[string]string{"example.com/seen-by": "another-reader"}
		if err := e.admin.Update(e.ctx, old); err != nil {
			t.Fatal(err)
		}
		faults(got, 0)
	})

	// Issue 31: with TaintNodes the node an avoid-host relaunch leaves is
	// tainted too, once a ClusterRole grants get and update on nodes; with
	// the plugin's Role alone the taint is refused (logged) and the
	// relaunch goes on all the same.
	t.Run("TaintNodesTaintsTheFailedNode", func(t *testing.T) {
		e := newJobEnv(t, cfg, "taint")
		e.watch(t)
		w0 := e.waitRunning(t, "worker-0", "")
		w1 := e.waitRunning(t, "worker-1", "")
		taintOf := func() (string, bool) {
			var n corev1.Node
			if err := e.admin.Get(e.ctx, client.ObjectKey{Name: nodes[0]}, &n); err != nil {
				t.Fatal(err)
			}
			for _, tn := range n.Spec.Taints {
				if tn.Key == UnhealthyTaint {
					return tn.Value + ":" + string(tn.Effect), true
				}
			}
			return "", false
		}
		t.Cleanup(func() { // the simulated node is the other cases' too
			_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				var n corev1.Node
				if err := e.admin.Get(context.Background(), client.ObjectKey{Name: nodes[0]}, &n); err != nil {
					return err
				}
				n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(tn corev1.Taint) bool { return tn.Key == UnhealthyTaint })
				return e.admin.Update(context.Background(), &n)
			})
		})
		tainting := func() *Owner {
			o, err := New(Config{Host: e.rest.Host, CAData: e.rest.CAData, BearerToken: e.token, Namespace: e.ns, Job: e.job0,
				Logger: e.logger, TaintNodes: true})
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
		if err := tainting().Carry(e.ctx, Action{Seq: 1, Kind: relaunch.AvoidHost, Pod: w0.Name, UID: string(w0.UID),
			Reason: kferrors.CodeNodeLost, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if p := e.waitRunning(t, "worker-0", w0.UID); p.Spec.NodeName != nodes[1] {
			t.Errorf("replacement on %s", p.Spec.NodeName)
		}
		if v, ok := taintOf(); ok {
			t.Fatalf("tainted (%s) with the plugin's Role alone", v)
		}
		e.grantNodes(t, "get", "update")
		if err := tainting().Carry(e.ctx, Action{Seq: 2, Kind: relaunch.AvoidHost, Pod: w1.Name, UID: string(w1.UID),
			Reason: kferrors.CodeGpuFallenOffBus, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if v, ok := taintOf(); !ok || v != kferrors.CodeGpuFallenOffBus+":NoSchedule" {
			t.Errorf("taint %q (%v), want %s:NoSchedule", v, ok, kferrors.CodeGpuFallenOffBus)
		}
		if p := e.waitRunning(t, "worker-1", w1.UID); p.Spec.NodeName != nodes[1] {
			t.Errorf("replacement on %s", p.Spec.NodeName)
		}
	})

	t.Run("CarryIsIdempotent", func(t *testing.T) {
		e := newJobEnv(t, cfg, "idem")
		e.watch(t)
		old := e.waitRunning(t, "worker-1", "")
		a := Action{Seq: 7, Kind: relaunch.MoreMemory, Rank: 1, Pod: e.name("worker-1"), UID: string(old.UID), Reason: kferrors.CodeOOMKilled, Time: time.Now()}
		for range 2 {
			if err := e.owner.Carry(e.ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		p := e.waitRunning(t, "worker-1", old.UID)
		if l := limit(p); l.Cmp(resource.MustParse("2Gi")) != 0 {
			t.Fatalf("limit %s", l.String())
		}
		// Once more from this owner, and from a restarted master (a new
		// owner with no memory): the job records carried decisions.
		restarted := e.newOwner(t, relaunch.OOM{})
		for _, o := range []*Owner{e.owner, restarted} {
			if err := o.Carry(e.ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second) // time for a wrong deletion to show
		if l, _ := e.templateMemory(t); l != "2Gi" {
			t.Errorf("template limit %s after the same decision 4 times, want 2Gi", l)
		}
		if now := e.pod(t, "worker-1"); now == nil || now.UID != p.UID {
			t.Error("the replacement that already had the memory was deleted again")
		}
		if recs := carriedOf(e.jobObject(t)); len(recs) != 1 || recs[0].Seq != 7 || recs[0].Memory != 2<<30 {
			t.Errorf("carried record %+v", recs)
		}
		// The same Seq for another pod is a caller's bug, not a new edit.
		b := a
		b.Pod = e.name("worker-0")
		if err := e.owner.Carry(e.ctx, b); !errors.Is(err, ErrInvalidAction) || !Permanent(err) {
			t.Errorf("seq 7 for another pod: %v", err)
		}
	})

	t.Run("OOMCapIsAnErrorAndChangesNothing", func(t *testing.T) {
		e := newJobEnv(t, cfg, "cap")
		capped := e.newOwner(t, relaunch.OOM{Factor: 2, Max: 1 << 30}) // the job already has 1Gi
		w0 := e.waitRunning(t, "worker-0", "")
		w1 := e.waitRunning(t, "worker-1", "")
		before := e.job(t)
		err := capped.Carry(e.ctx, Action{Seq: 1, Kind: relaunch.MoreMemory, Pod: e.name("worker-1"), UID: string(w1.UID), Time: time.Now()})
		if !errors.Is(err, ErrMemoryAtCap) || !Permanent(err) || !strings.Contains(err.Error(), "1Gi") {
			t.Fatalf("err %v, want ErrMemoryAtCap naming 1Gi", err)
		}
		t.Logf("at the cap: %v", err)
		time.Sleep(500 * time.Millisecond)
		if after := e.job(t); after.ResourceVersion != before.ResourceVersion {
			t.Errorf("job changed: resourceVersion %s → %s", before.ResourceVersion, after.ResourceVersion)
		}
		for _, p := range []*corev1.Pod{w0, w1} {
			if now := e.pod(t, strings.TrimPrefix(p.Name, e.job0+"-")); now == nil || now.UID != p.UID {
				t.Errorf("%s was replaced", p.Name)
			}
		}
	})

	t.Run("RoleIsScopedToItsJob", func(t *testing.T) {
		e := newJobEnv(t, cfg, "rbac")
		other := e.createJob(t, e.job0+"-other")
		o, err := New(Config{Host: e.rest.Host, CAData: e.rest.CAData, BearerToken: e.token, Namespace: e.ns, Job: other,
			Logger: e.logger})
		if err != nil {
			t.Fatal(err)
		}
		w := e.waitPodOf(t, other, "worker-0", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		err = o.Carry(e.ctx, Action{Seq: 1, Kind: relaunch.MoreMemory, Pod: other + "-worker-0", UID: string(w.UID), Time: time.Now()})
		var apiErr *APIError
		if !errors.As(err, &apiErr) || apiErr.Code != 403 || !Permanent(err) {
			t.Fatalf("updating another job with this job's token: %v, want 403", err)
		}
		// Nor another namespace's pods.
		o2, _ := New(Config{Host: e.rest.Host, CAData: e.rest.CAData, BearerToken: e.token, Namespace: "default", Job: e.job0, Logger: e.logger})
		if _, err := o2.list(e.ctx, func(PodGone) {}); !errors.As(err, &apiErr) || apiErr.Code != 403 {
			t.Errorf("listing pods of another namespace: %v, want 403", err)
		}
	})

	t.Run("WatchReportsEvictedAndDeletedPods", func(t *testing.T) {
		e := newJobEnv(t, cfg, "watch")
		e.watch(t)
		w0 := e.waitRunning(t, "worker-0", "")
		w1 := e.waitRunning(t, "worker-1", "")
		// Evicted by the kubelet (node pressure): phase Failed, reason
		// Evicted, its container killed.
		e.setStatus(t, "worker-0", func(s *corev1.PodStatus) {
			exited(137, "Error")(s)
			s.Reason, s.Message = "Evicted", "The node was low on resource: memory."
		})
		g := e.waitGone(t, "worker-0", kferrors.CodeEvicted)
		if g.UID != string(w0.UID) || !g.Recoverable || !strings.Contains(g.Message, "low on resource") {
			t.Errorf("evicted: %+v", g)
		}
		// Deleted by someone else (a preemption, kubectl delete).
		if err := e.admin.Delete(e.ctx, w1); err != nil {
			t.Fatal(err)
		}
		g = e.waitGone(t, "worker-1", kferrors.CodePreempted)
		if g.UID != string(w1.UID) || !g.Recoverable {
			t.Errorf("deleted: %+v", g)
		}
		// The operator recreates both; nothing more is reported.
		e.waitRunning(t, "worker-0", w0.UID)
		e.waitRunning(t, "worker-1", w1.UID)
		time.Sleep(500 * time.Millisecond)
		e.noReport(t, "")
	})

	t.Run("WatchReportsPodsThatFailedBeforeItStarted", func(t *testing.T) {
		e := newJobEnv(t, cfg, "level")
		w1 := e.waitRunning(t, "worker-1", "")
		e.setStatus(t, "worker-1", exited(1, "Error")) // a user error: the operator fails the job and keeps the pod
		e.waitPod(t, "worker-1", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		e.watch(t)
		g := e.waitGone(t, "worker-1", kferrors.CodeNonZeroExit)
		if g.UID != string(w1.UID) || g.Recoverable {
			t.Errorf("%+v", g)
		}
	})

	t.Run("RelaunchForceDeletesPodsOfALostNode", func(t *testing.T) {
		// A node without a kubelet (no simulator plays it) takes the
		// first pod of each index; replacements go to the simulated nodes.
		var r [3]byte
		_, _ = rand.Read(r[:])
		lost := "lost-node-" + hex.EncodeToString(r[:])
		var mu sync.Mutex
		first := map[string]types.UID{}
		e := newJobEnv(t, cfg, "lost", func(p *corev1.Pod) []string {
			mu.Lock()
			defer mu.Unlock()
			if uid, ok := first[p.Name]; !ok || uid == p.UID {
				first[p.Name] = p.UID
				return []string{lost}
			}
			return nodes
		})
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: lost, Labels: map[string]string{HostnameLabel: lost}}}
		if err := e.admin.Create(e.ctx, node); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.admin.Delete(context.Background(), node) })
		e.watch(t)
		var was [2]*corev1.Pod
		for i, w := range []string{"worker-0", "worker-1"} {
			e.waitPod(t, w, "bound to "+lost, func(p *corev1.Pod) bool { return p.Spec.NodeName == lost })
			e.setStatus(t, w, running) // as its kubelet reported before the node went away
			was[i] = e.waitRunning(t, w, "")
		}
		// worker-0: the taint manager evicts it from the NotReady node; the
		// graceful deletion waits for a kubelet that is gone.
		e.setStatus(t, "worker-0", func(s *corev1.PodStatus) {
			s.Conditions = append(s.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
				Reason: "DeletionByTaintManager", LastTransitionTime: metav1.Now()})
		})
		if err := e.admin.Delete(e.ctx, was[0]); err != nil {
			t.Fatal(err)
		}
		// worker-1: marked by the node controller.
		e.setStatus(t, "worker-1", func(s *corev1.PodStatus) {
			s.Phase, s.Reason, s.Message = corev1.PodUnknown, "NodeLost", "Node "+lost+" which was running the pod is unresponsive"
		})
		var actions []Action
		for i, w := range []string{"worker-0", "worker-1"} {
			g := e.waitGone(t, w, kferrors.CodeNodeLost)
			if g.UID != string(was[i].UID) || g.Node != lost {
				t.Errorf("%s: %+v", w, g)
			}
			a := Action{Seq: int64(i + 1), Kind: relaunch.Relaunch, Pod: g.Pod, UID: g.UID, Reason: g.Code, Time: time.Now()}
			if err := e.owner.Carry(e.ctx, a); err != nil {
				t.Fatal(err)
			}
			actions = append(actions, a)
		}
		var now [2]*corev1.Pod
		for i, w := range []string{"worker-0", "worker-1"} {
			now[i] = e.waitRunning(t, w, was[i].UID)
			if now[i].Spec.NodeName != nodes[0] {
				t.Errorf("%s replaced on %s", w, now[i].Spec.NodeName)
			}
		}
		// Carried again (a retry, a restarted master that knows only the
		// decision time): the replacements stay.
		restarted := e.newOwner(t, relaunch.OOM{})
		for _, a := range actions {
			if err := e.owner.Carry(e.ctx, a); err != nil {
				t.Fatal(err)
			}
			a.UID = ""
			if err := restarted.Carry(e.ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(500 * time.Millisecond)
		for i, w := range []string{"worker-0", "worker-1"} {
			if p := e.pod(t, w); p == nil || p.UID != now[i].UID {
				t.Errorf("%s's replacement was deleted", w)
			}
		}
		e.noReport(t, "")
	})
}

// jobEnv is one test's namespace with the master's RBAC objects, a
// two-worker PyTorchJob (restartPolicy ExitCode, 1Gi limit, 512Mi
// request), a binder standing in for the scheduler, and an Owner running as
// the master's service account.
type jobEnv struct {
	ctx    context.Context
	rest   *rest.Config
	admin  client.Client
	ns     string
	job0   string
	token  string
	owner  *Owner
	logger *slog.Logger

	mu      sync.Mutex
	reports []PodGone
	used    []bool
}

// newJobEnv makes the job; bind (optional) picks the nodes a pod may be
// bound to, default nodes.
func newJobEnv(t *testing.T, cfg *rest.Config, name string, bind ...func(*corev1.Pod) []string) *jobEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	admin, err := client.New(cfg, client.Options{Scheme: kubeenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var r [3]byte
	_, _ = rand.Read(r[:])
	w := &testWriter{t: t}
	t.Cleanup(w.stop) // last: after the owner's goroutines
	e := &jobEnv{ctx: ctx, rest: cfg, admin: admin, ns: "kube-" + name + "-" + hex.EncodeToString(r[:]), job0: name,
		logger: slog.New(slog.NewTextHandler(w, nil))}
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.cleanup(t) })
	// The master's objects as the plugin creates them, and a token for its
	// service account as the kubelet would mount one.
	for _, o := range kfoperator.MasterObjects(name, e.ns, "job-token", nil, nil) {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: kfoperator.MasterAccountName(name), Namespace: e.ns}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}
	if err := admin.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatal(err)
	}
	e.token = tr.Status.Token
	e.createJob(t, name)
	e.owner = e.newOwner(t, relaunch.OOM{})
	// The scheduler's part: bind pending pods to the first node their
	// affinity allows.
	nodesFor := kubeenv.Nodes(nodes...)
	if len(bind) > 0 {
		nodesFor = bind[0]
	}
	bctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for bctx.Err() == nil {
			if err := kubeenv.BindPods(bctx, admin, e.ns, nil, nodesFor); err != nil && bctx.Err() == nil {
				t.Logf("binding: %v", err)
			}
			select {
			case <-bctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stop(); <-done })
	return e
}

func ptr[T any](v T) *T { return &v }

// gpuEvent records a Warning event against pod p as a node daemon would.
func (e *jobEnv) gpuEvent(t *testing.T, p *corev1.Pod, reason, msg string) *corev1.Event {
	return e.gpuEventAt(t, p, reason, msg, time.Now())
}

func (e *jobEnv) gpuEventAt(t *testing.T, p *corev1.Pod, reason, msg string, at time.Time) *corev1.Event {
	t.Helper()
	return e.warningEvent(t, p, "gpu-health", reason, msg, at)
}

// warningEvent records a Warning event against pod p from source.
func (e *jobEnv) warningEvent(t *testing.T, p *corev1.Pod, source, reason, msg string, at time.Time) *corev1.Event {
	t.Helper()
	var r [4]byte
	_, _ = rand.Read(r[:])
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: p.Name + "." + hex.EncodeToString(r[:]), Namespace: e.ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: e.ns, Name: p.Name, UID: p.UID, APIVersion: "v1"},
		Reason:         reason, Message: msg, Type: corev1.EventTypeWarning, Count: 1,
		FirstTimestamp: metav1.NewTime(at), LastTimestamp: metav1.NewTime(at),
		Source: corev1.EventSource{Component: source, Host: p.Spec.NodeName},
	}
	if err := e.admin.Create(e.ctx, ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

// bothOnFirstNode waits for the job's two workers to run and checks that
// the scheduler's part put both on nodes[0].
func (e *jobEnv) bothOnFirstNode(t *testing.T) (w0, w1 *corev1.Pod) {
	t.Helper()
	w0 = e.waitRunning(t, "worker-0", "")
	w1 = e.waitRunning(t, "worker-1", "")
	if w0.Spec.NodeName != nodes[0] || w1.Spec.NodeName != nodes[0] {
		t.Fatalf("pods on %s and %s, want both on %s", w0.Spec.NodeName, w1.Spec.NodeName, nodes[0])
	}
	return w0, w1
}

// nodeEvent records a GPU health daemon's Xid or SXid event (by the
// message's tail) against node, in "default" as the API server requires of
// a cluster object's events.
func (e *jobEnv) nodeEvent(t *testing.T, node, msg string, at time.Time) *corev1.Event {
	t.Helper()
	var r [4]byte
	_, _ = rand.Read(r[:])
	reason := kferrors.EventReasonXid
	if strings.Contains(msg, " sxid=") {
		reason = kferrors.EventReasonSXid
	}
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: node + "." + hex.EncodeToString(r[:]), Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node), APIVersion: "v1"},
		Reason:         reason, Message: msg, Type: corev1.EventTypeWarning, Count: 1,
		FirstTimestamp: metav1.NewTime(at), LastTimestamp: metav1.NewTime(at),
		Source: corev1.EventSource{Component: "gpu-health", Host: node},
	}
	if err := e.admin.Create(e.ctx, ev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.admin.Delete(context.Background(), ev) })
	return ev
}

// grantNodeEvents binds a Role in "default" with list and watch on events
// to the master's service account, as the master's log asks, and waits
// until the account may list them.
func (e *jobEnv) grantNodeEvents(t *testing.T) {
	t.Helper()
	name := e.ns + "-node-events"
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list", "watch"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: kfoperator.MasterAccountName(e.job0), Namespace: e.ns}}}
	for _, o := range []client.Object{role, binding} {
		if err := e.admin.Create(e.ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.admin.Delete(context.Background(), o) })
	}
	o := e.newOwner(t, relaunch.OOM{})
	for end := time.Now().Add(10 * time.Second); ; {
		var l eventList
		err := o.c.do(e.ctx, "GET", "/api/v1/namespaces/default/events", nil, nil, &l)
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the master's service account still may not list events in default 10 s after the binding: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// grantNodes binds a ClusterRole with verbs on nodes to the master's
// service account, as a platform engineer would, and waits until the
// account may get nodes (RBAC's authorizer learns of bindings through its
// informers).
func (e *jobEnv) grantNodes(t *testing.T, verbs ...string) {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: e.ns + "-nodes"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: verbs}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: e.ns + "-nodes"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: kfoperator.MasterAccountName(e.job0), Namespace: e.ns}}}
	for _, o := range []client.Object{role, binding} {
		if err := e.admin.Create(e.ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.admin.Delete(context.Background(), o) })
	}
	for end := time.Now().Add(10 * time.Second); e.newOwner(t, relaunch.OOM{}).nodeCondition(e.ctx, nodes[0]) == ""; {
		if time.Now().After(end) {
			t.Fatal("the master's service account still may not get nodes 10 s after the binding")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// newOwner is an Owner of the test's job running with the master's token.
func (e *jobEnv) newOwner(t *testing.T, oom relaunch.OOM) *Owner {
	t.Helper()
	o, err := New(Config{Host: e.rest.Host, CAData: e.rest.CAData, BearerToken: e.token, Namespace: e.ns, Job: e.job0,
		OOM: oom, Logger: e.logger, Resync: 500 * time.Millisecond, ForceAfter: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// watch runs the Owner's Watch for the rest of the test.
func (e *jobEnv) watch(t *testing.T) {
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() {
		done <- e.owner.Watch(ctx, func(g PodGone) {
			e.mu.Lock()
			e.reports, e.used = append(e.reports, g), append(e.used, false)
			e.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
}

func (e *jobEnv) createJob(t *testing.T, name string) string {
	t.Helper()
	two := int32(2)
	none := kubeflowv1.CleanPodPolicyNone
	job := &kubeflowv1.PyTorchJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: kubeflowv1.PyTorchJobSpec{
			RunPolicy: kubeflowv1.RunPolicy{CleanPodPolicy: &none},
			PyTorchReplicaSpecs: map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaSpec{
				kubeflowv1.PyTorchJobReplicaTypeWorker: {
					Replicas:      &two,
					RestartPolicy: kubeflowv1.RestartPolicyExitCode,
					Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
						Name: "pytorch", Image: "trainer:1", Command: []string{"python", "train.py"},
						Resources: corev1.ResourceRequirements{
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
							Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
						},
					}}}},
				},
			},
		},
	}
	if err := e.admin.Create(e.ctx, job); err != nil {
		t.Fatal(err)
	}
	return name
}

// cleanup removes what the test made (there is no garbage collector or
// namespace controller in envtest): the jobs, the pods, the namespace.
func (e *jobEnv) cleanup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.admin.DeleteAllOf(ctx, &kubeflowv1.PyTorchJob{}, client.InNamespace(e.ns))
	_ = e.admin.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(e.ns), client.GracePeriodSeconds(0))
	if err := e.admin.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}); err != nil && !apierrors.IsNotFound(err) {
		t.Logf("deleting namespace %s: %v", e.ns, err)
	}
}

func (e *jobEnv) name(suffix string) string { return e.job0 + "-" + suffix }

func (e *jobEnv) pod(t *testing.T, suffix string) *corev1.Pod {
	t.Helper()
	return e.podOf(t, e.job0, suffix)
}

func (e *jobEnv) podOf(t *testing.T, job, suffix string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{}
	err := e.admin.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: job + "-" + suffix}, p)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *jobEnv) waitPod(t *testing.T, suffix, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return e.waitPodOf(t, e.job0, suffix, what, ok)
}

func (e *jobEnv) waitPodOf(t *testing.T, job, suffix, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	for {
		last = e.podOf(t, job, suffix)
		if last != nil && last.DeletionTimestamp == nil && ok(last) {
			return last
		}
		select {
		case <-e.ctx.Done():
			t.Fatalf("timed out waiting for %s-%s: %s; last %+v", job, suffix, what, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitRunning waits for a Running pod of that name whose UID is not
// notUID (a replacement), or any if notUID is "".
func (e *jobEnv) waitRunning(t *testing.T, suffix string, notUID types.UID) *corev1.Pod {
	t.Helper()
	return e.waitPod(t, suffix, "Running, UID other than "+string(notUID), func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && p.UID != notUID
	})
}

// setStatus changes a pod's status as the kubelet would (the node
// simulator writes it too: retried on conflict).
func (e *jobEnv) setStatus(t *testing.T, suffix string, change func(*corev1.PodStatus)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := &corev1.Pod{}
		if err := e.admin.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: e.name(suffix)}, p); err != nil {
			return err
		}
		change(&p.Status)
		return e.admin.Status().Update(e.ctx, p)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// running is the status a kubelet reports for a started pod.
func running(s *corev1.PodStatus) {
	now := metav1.Now()
	s.Phase = corev1.PodRunning
	s.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	s.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", Image: "trainer:1", Ready: true, Started: ptr(true),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
}

// exited ends the primary container with code (and reason), the pod
// Failed.
func exited(code int32, reason string) func(*corev1.PodStatus) {
	return func(s *corev1.PodStatus) {
		at := metav1.Now()
		s.Phase = corev1.PodFailed
		for i := range s.ContainerStatuses {
			cs := &s.ContainerStatuses[i]
			if cs.Name == "pytorch" {
				cs.Ready, cs.Started = false, ptr(false)
				cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: reason, ExitCode: code,
					StartedAt: metav1.NewTime(at.Add(-time.Minute)), FinishedAt: at}}
			}
		}
	}
}

// waitGone waits for the Owner's report of that pod with that code, and
// marks it seen.
func (e *jobEnv) waitGone(t *testing.T, suffix, code string) PodGone {
	t.Helper()
	for {
		e.mu.Lock()
		for i, g := range e.reports {
			if !e.used[i] && g.Pod == e.name(suffix) && g.Code == code {
				e.used[i] = true
				e.mu.Unlock()
				return g
			}
		}
		e.mu.Unlock()
		select {
		case <-e.ctx.Done():
			t.Fatalf("no %s report for %s; reports %+v", code, suffix, e.allReports())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// noReport fails if a report (of code, or any if "") came that no waitGone
// took.
func (e *jobEnv) noReport(t *testing.T, code string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, g := range e.reports {
		if !e.used[i] && (code == "" || g.Code == code) {
			t.Errorf("unexpected report %+v", g)
		}
	}
}

func (e *jobEnv) allReports() []PodGone {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]PodGone(nil), e.reports...)
}

func (e *jobEnv) job(t *testing.T) *kubeflowv1.PyTorchJob {
	t.Helper()
	job := &kubeflowv1.PyTorchJob{}
	if err := e.admin.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: e.job0}, job); err != nil {
		t.Fatal(err)
	}
	return job
}

func (e *jobEnv) jobObject(t *testing.T) object {
	t.Helper()
	var job object
	if err := e.owner.c.do(e.ctx, "GET", e.owner.jobPath, nil, nil, &job); err != nil {
		t.Fatal(err)
	}
	return job
}

func (e *jobEnv) templateMemory(t *testing.T) (limit, request string) {
	t.Helper()
	c := e.job(t).Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker].Template.Spec.Containers[0]
	l, r := c.Resources.Limits[corev1.ResourceMemory], c.Resources.Requests[corev1.ResourceMemory]
	return l.String(), r.String()
}

func limit(p *corev1.Pod) resource.Quantity {
	return p.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]
}

func avoids(p *corev1.Pod, host string) bool {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return false
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		found := false
		for _, r := range term.MatchExpressions {
			if r.Key == HostnameLabel && r.Operator == corev1.NodeSelectorOpNotIn {
				for _, v := range r.Values {
					found = found || v == host
				}
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// testWriter sends the Owner's logs to the test log while the test runs.
type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}

var _ io.Writer = (*testWriter)(nil)
