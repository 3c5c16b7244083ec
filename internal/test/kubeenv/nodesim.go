package kubeenv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SimNodeAnnotation marks the nodes a node simulator (StartSimNodes) plays
// the kubelet of; its value is "true".
const SimNodeAnnotation = "kfelastic.test/simulated-node"

// SimNodeLabel is the label type=SimNodeLabel on the nodes StartSimNodes
// registers.
const SimNodeLabel = "simulated"

// StartSimNodes plays the kubelet of simulated nodes for the test's
// duration, in the test process, against the API server of cfg, and
// registers the named nodes (labelled type=simulated and
// kubernetes.io/hostname=<name>, annotated SimNodeAnnotation); a node the
// test creates later with the annotation is played too.
//
// It is a simulator, where the e2e cluster's kubelet is real: for the tests
// whose subject is the API objects (the training operator's pods, the
// master's decisions, the plugin's phases), which need pods that reach
// Running and go away when deleted, not processes. A simulated node is
// Ready (its Ready condition and its Lease in kube-node-lease renewed
// every 10 s, so that a controller manager's node lifecycle controller
// keeps it), with room for any pod; a pod bound to it that is Pending
// becomes Running with every container started and an IP, and is left as
// it is after that (a test writes the kubelet's later reports itself); a
// deleted pod is removed at once (finalizers dropped, grace period 0).
// Pods are bound by the cluster's scheduler, or without one (envtest) by
// the test (BindPods).
//
// It replaces kwok, whose build was ≈350 CPU-s of a cold make test (its
// own set of Kubernetes modules) for the four stages used here.
func StartSimNodes(t testing.TB, cfg *rest.Config, nodes ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a kube-apiserver (run without -short)")
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	for _, name := range nodes {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{SimNodeAnnotation: "true"},
			Labels:      map[string]string{"type": SimNodeLabel, "kubernetes.io/hostname": name}}}
		if err := c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
			cancel()
			t.Fatal(err)
		}
	}
	s := &nodeSim{c: c, nodes: map[string]bool{}, logf: t.Logf}
	done := make(chan struct{})
	go func() { defer close(done); s.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// nodeSim is StartSimNodes's kubelet for every annotated node.
type nodeSim struct {
	c     client.WithWatch
	logf  func(string, ...any)
	mu    sync.Mutex
	nodes map[string]bool // the annotated nodes seen, by name
	ips   int             // pod IPs handed out
}

// run follows nodes and pods until ctx ends: a watch of each, listed
// again whenever a watch ends, and the heartbeats every 10 s.
func (s *nodeSim) run(ctx context.Context) {
	for ctx.Err() == nil {
		nodeWatch, podWatch, err := s.resync(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.logf("node simulator: %v (listing again in 1 s)", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		s.follow(ctx, nodeWatch, podWatch)
	}
}

// resync lists nodes, then pods, acts on each, and returns watches from
// those lists' versions.
func (s *nodeSim) resync(ctx context.Context) (watch.Interface, watch.Interface, error) {
	var nodes corev1.NodeList
	if err := s.c.List(ctx, &nodes); err != nil {
		return nil, nil, err
	}
	for i := range nodes.Items {
		s.node(ctx, &nodes.Items[i], false)
	}
	nodeWatch, err := s.c.Watch(ctx, &corev1.NodeList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: nodes.ResourceVersion}})
	if err != nil {
		return nil, nil, err
	}
	podWatch, err := s.resyncPods(ctx)
	if err != nil {
		nodeWatch.Stop()
		return nil, nil, err
	}
	return nodeWatch, podWatch, nil
}

func (s *nodeSim) resyncPods(ctx context.Context) (watch.Interface, error) {
	var pods corev1.PodList
	if err := s.c.List(ctx, &pods); err != nil {
		return nil, err
	}
	for i := range pods.Items {
		s.pod(ctx, &pods.Items[i])
	}
	return s.c.Watch(ctx, &corev1.PodList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: pods.ResourceVersion}})
}

// follow acts on the watches' events until one of them ends (a relist
// then) or ctx does, and stops them. A node newly annotated has its pods
// listed again: their events may have come before its own.
func (s *nodeSim) follow(ctx context.Context, nodeWatch, podWatch watch.Interface) {
	defer func() { nodeWatch.Stop(); podWatch.Stop() }()
	beat := time.NewTicker(10 * time.Second)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			s.heartbeats(ctx)
		case ev, ok := <-nodeWatch.ResultChan():
			if !ok || ev.Type == watch.Error {
				return
			}
			if n, isNode := ev.Object.(*corev1.Node); isNode && s.node(ctx, n, ev.Type == watch.Deleted) {
				w, err := s.resyncPods(ctx)
				if err != nil {
					return
				}
				podWatch.Stop()
				podWatch = w
			}
		case ev, ok := <-podWatch.ResultChan():
			if !ok || ev.Type == watch.Error {
				return
			}
			if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type != watch.Deleted {
				s.pod(ctx, p)
			}
		}
	}
}

// node takes note of an annotated node (forgets a deleted one) and makes
// it Ready; it says whether the node is newly played.
func (s *nodeSim) node(ctx context.Context, n *corev1.Node, deleted bool) bool {
	if n.Annotations[SimNodeAnnotation] != "true" {
		return false
	}
	s.mu.Lock()
	known := s.nodes[n.Name]
	if deleted {
		delete(s.nodes, n.Name)
	} else {
		s.nodes[n.Name] = true
	}
	s.mu.Unlock()
	if deleted {
		return false
	}
	if !nodeReady(n) {
		s.update(ctx, n, func(n *corev1.Node) { simNodeStatus(&n.Status, n.Name, time.Now()) })
	}
	return !known
}

// pod starts a Pending pod bound to a played node and removes a deleted
// one; any other pod it leaves alone.
func (s *nodeSim) pod(ctx context.Context, p *corev1.Pod) {
	s.mu.Lock()
	played := s.nodes[p.Spec.NodeName]
	s.mu.Unlock()
	if !played {
		return
	}
	if p.DeletionTimestamp != nil {
		if len(p.Finalizers) > 0 {
			patch := client.MergeFrom(p.DeepCopy())
			p.Finalizers = nil
			if err := s.c.Patch(ctx, p, patch); err != nil && !apierrors.IsNotFound(err) {
				s.logf("node simulator: %s/%s: drop finalizers: %v", p.Namespace, p.Name, err)
			}
		}
		if err := s.c.Delete(ctx, p, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			s.logf("node simulator: %s/%s: delete: %v", p.Namespace, p.Name, err)
		}
		return
	}
	if !podToStart(p) {
		return
	}
	s.mu.Lock()
	s.ips++
	ip := fmt.Sprintf("10.244.%d.%d", s.ips/250, s.ips%250+2)
	s.mu.Unlock()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var now corev1.Pod
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(p), &now); err != nil {
			return err
		}
		if now.UID != p.UID || now.DeletionTimestamp != nil || !podToStart(&now) {
			return nil // replaced, deleted or started meanwhile
		}
		simPodRunning(&now, ip, time.Now())
		return s.c.Status().Update(ctx, &now)
	})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		s.logf("node simulator: %s/%s: start: %v", p.Namespace, p.Name, err)
	}
}

// heartbeats renews each played node's Ready condition and Lease, as a
// kubelet does.
func (s *nodeSim) heartbeats(ctx context.Context) {
	s.mu.Lock()
	names := make([]string, 0, len(s.nodes))
	for n := range s.nodes {
		names = append(names, n)
	}
	s.mu.Unlock()
	now := time.Now()
	for _, name := range names {
		var n corev1.Node
		if err := s.c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			continue
		}
		s.update(ctx, &n, func(n *corev1.Node) {
			for i := range n.Status.Conditions {
				n.Status.Conditions[i].LastHeartbeatTime = metav1.NewTime(now)
			}
		})
		s.renewLease(ctx, &n, now)
	}
}

// update changes a node's status, re-read and retried on a conflict.
func (s *nodeSim) update(ctx context.Context, n *corev1.Node, change func(*corev1.Node)) {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var now corev1.Node
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(n), &now); err != nil {
			return err
		}
		change(&now)
		return s.c.Status().Update(ctx, &now)
	})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		s.logf("node simulator: node %s: %v", n.Name, err)
	}
}

func (s *nodeSim) renewLease(ctx context.Context, n *corev1.Node, now time.Time) {
	renew := metav1.NewMicroTime(now)
	var l coordinationv1.Lease
	err := s.c.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: n.Name}, &l)
	switch {
	case apierrors.IsNotFound(err):
		l = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: n.Name,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &n.Name, LeaseDurationSeconds: ptr.To(int32(40)), RenewTime: &renew}}
		err = s.c.Create(ctx, &l)
	case err == nil:
		l.Spec.RenewTime = &renew
		err = s.c.Update(ctx, &l)
	}
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
		s.logf("node simulator: lease of %s: %v", n.Name, err)
	}
}

// nodeReady says whether the node's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podToStart says whether a kubelet would still start the pod: Pending
// (or no phase yet) and not Ready. A pod a test has since reported
// Running, Failed or Succeeded is the test's.
func podToStart(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodPending && p.Status.Phase != "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return false
		}
	}
	return true
}

// simNodeStatus is a Ready node's status, with room for any pod.
func simNodeStatus(st *corev1.NodeStatus, name string, now time.Time) {
	t := metav1.NewTime(now)
	cond := func(typ corev1.NodeConditionType, status corev1.ConditionStatus, reason string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: typ, Status: status, Reason: reason, LastHeartbeatTime: t, LastTransitionTime: t}
	}
	st.Conditions = []corev1.NodeCondition{
		cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady"),
		cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory"),
		cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure"),
		cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID"),
		cond(corev1.NodeNetworkUnavailable, corev1.ConditionFalse, "RouteCreated"),
	}
	room := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("250"),
	}
	st.Capacity, st.Allocatable = room, room.DeepCopy()
	if len(st.Addresses) == 0 {
		st.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.255.0.1"}, {Type: corev1.NodeHostName, Address: name}}
	}
	st.NodeInfo.KubeletVersion = "simulated"
	st.NodeInfo.OperatingSystem, st.NodeInfo.Architecture = "linux", "amd64"
	st.Phase = corev1.NodeRunning
}

// simPodRunning is what a kubelet reports once it has started every
// container of the pod: init containers completed, containers running and
// ready, the pod Running with an IP.
func simPodRunning(p *corev1.Pod, ip string, now time.Time) {
	t := metav1.NewTime(now)
	st := &p.Status
	st.Phase = corev1.PodRunning
	st.HostIP, st.PodIP = "10.255.0.1", ip
	st.HostIPs, st.PodIPs = []corev1.HostIP{{IP: "10.255.0.1"}}, []corev1.PodIP{{IP: ip}}
	if st.StartTime == nil {
		st.StartTime = &t
	}
	st.Conditions = nil
	for _, typ := range []corev1.PodConditionType{corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: typ, Status: corev1.ConditionTrue, LastTransitionTime: t})
	}
	st.InitContainerStatuses = nil
	for _, c := range p.Spec.InitContainers {
		st.InitContainerStatuses = append(st.InitContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, Ready: true,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: t, FinishedAt: t}}})
	}
	st.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: t}}})
	}
}
