package kfoperator

import (
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	corev1 "k8s.io/api/core/v1"
)

// PodFailed reports whether a pod of a job has failed for good, by the
// same rule as the master's pod watch (kferrors.ClassifyPod): phase Failed,
// its node lost (the node controller leaves such pods Unknown, or Running
// with reason NodeLost), its primary container ended badly, or the system
// terminating it (a DisruptionTarget condition).
func PodFailed(p *corev1.Pod) bool {
	_, ok := kferrors.ClassifyPod(podStatus(p, ""), time.Time{})
	return ok
}

// Synthesize makes the error document of a failed pod that left none, from
// its status alone (kferrors.ClassifyPod: the pod's reason, else the last
// terminated state of its primary container). fallback (the job's terminal
// time) stands in for a time the status does not give. ok is false for a
// pod that has not failed.
func Synthesize(p *corev1.Pod, primary string, fallback time.Time) (f kferrors.Failure, ok bool) {
	return kferrors.ClassifyPod(podStatus(p, primary), fallback)
}

// podStatus is the part of p that ClassifyPod reads. The plugin does not
// know who deleted a pod, so a deletion is not read as a failure here.
func podStatus(p *corev1.Pod, primary string) kferrors.PodStatus {
	s := kferrors.PodStatus{Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase), Reason: p.Status.Reason,
		Message: p.Status.Message, Primary: primary}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			s.Disruption = c.Reason
		}
		if c.LastTransitionTime.After(s.LastTransition) {
			s.LastTransition = c.LastTransitionTime.Time
		}
	}
	for _, c := range p.Spec.Containers {
		if c.Name == primary {
			mem := c.Resources.Limits.Memory()
			if mem.IsZero() {
				mem = c.Resources.Requests.Memory()
			}
			s.Memory = mem.Value()
		}
	}
	s.InitContainers, s.Containers = containerStatuses(p.Status.InitContainerStatuses), containerStatuses(p.Status.ContainerStatuses)
	return s
}

func containerStatuses(list []corev1.ContainerStatus) []kferrors.ContainerStatus {
	out := make([]kferrors.ContainerStatus, len(list))
	for i, cs := range list {
		out[i] = kferrors.ContainerStatus{Name: cs.Name, Terminated: termination(cs.State.Terminated), LastTerminated: termination(cs.LastTerminationState.Terminated)}
	}
	return out
}

func termination(t *corev1.ContainerStateTerminated) *kferrors.Termination {
	if t == nil {
		return nil
	}
	return &kferrors.Termination{ExitCode: int(t.ExitCode), Signal: int(t.Signal), Reason: t.Reason, FinishedAt: t.FinishedAt.Time}
}
