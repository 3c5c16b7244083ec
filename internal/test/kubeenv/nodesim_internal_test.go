package kubeenv

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// A simulated kubelet starts a pod once: Pending (or new) and not Ready;
// once started, or reported Failed by a test, the pod is left alone.
func TestSimPodStartsOnce(t *testing.T) {
	p := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "agent-install", Image: "agent:1"}},
		Containers:     []corev1.Container{{Name: "pytorch", Image: "trainer:1"}, {Name: "sidecar", Image: "side:1"}},
	}}
	if !podToStart(p) {
		t.Fatal("a new pod is not started")
	}
	simPodRunning(p, "10.244.0.7", time.Unix(1800000000, 0))
	if podToStart(p) {
		t.Error("a Running pod would be started again")
	}
	st := p.Status
	if st.Phase != corev1.PodRunning || st.PodIP != "10.244.0.7" || len(st.ContainerStatuses) != 2 || len(st.InitContainerStatuses) != 1 {
		t.Fatalf("status %+v", st)
	}
	for _, cs := range st.ContainerStatuses {
		if !cs.Ready || cs.State.Running == nil || cs.Started == nil || !*cs.Started {
			t.Errorf("container %s: %+v", cs.Name, cs)
		}
	}
	if cs := st.InitContainerStatuses[0]; cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 {
		t.Errorf("init container: %+v", cs)
	}
	failed := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}
	if podToStart(failed) {
		t.Error("a Failed pod would be started")
	}
}

// A simulated node's status makes it Ready with room for pods, and keeps
// addresses it already has.
func TestSimNodeStatus(t *testing.T) {
	n := &corev1.Node{}
	n.Name = "sim-a"
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}}
	if nodeReady(n) {
		t.Fatal("a node without conditions is Ready")
	}
	simNodeStatus(&n.Status, n.Name, time.Now())
	if !nodeReady(n) {
		t.Fatal("not Ready")
	}
	if n.Status.Allocatable.Pods().Value() < 100 || n.Status.Allocatable.Cpu().Value() < 8 {
		t.Errorf("allocatable %v", n.Status.Allocatable)
	}
	if len(n.Status.Addresses) != 1 || n.Status.Addresses[0].Address != "192.0.2.1" {
		t.Errorf("addresses %v", n.Status.Addresses)
	}
}
