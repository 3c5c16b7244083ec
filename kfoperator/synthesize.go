package kfoperator

import (
	"fmt"
	"syscall"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	corev1 "k8s.io/api/core/v1"
)

// PodFailed reports whether a pod of a job has failed for good: phase
// Failed, or its node was lost (the node controller leaves such pods
// Unknown/Running with reason NodeLost).
func PodFailed(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Reason == "NodeLost"
}

// Synthesize makes the error document of a failed pod that left none, from
// its status alone: the pod's reason (Evicted, DeadlineExceeded, NodeLost),
// else the last terminated state of its primary container (OOMKilled, a
// signal, an exit code). The time is the container's finish time, else the
// pod's last condition transition, else fallback (the job's terminal time):
// never 1970. Pod statuses carry whole seconds (metav1.Time), so a
// synthesized failure ranks at the start of its second: within that second
// it can beat a document that was in fact earlier; across seconds the order
// is right. Worker is the pod name, as _F_WN gives it. ok is false for a
// pod that has not failed.
func Synthesize(p *corev1.Pod, primary string, fallback time.Time) (f kferrors.Failure, ok bool) {
	if !PodFailed(p) {
		return kferrors.Failure{}, false
	}
	name := p.Name
	term := terminated(p, primary)
	at := fallback
	for _, c := range p.Status.Conditions {
		if !c.LastTransitionTime.IsZero() && (at.IsZero() || c.LastTransitionTime.Time.After(at)) {
			at = c.LastTransitionTime.Time
		}
	}
	if term != nil && !term.FinishedAt.IsZero() {
		at = term.FinishedAt.Time
	}
	detail := p.Status.Message
	switch p.Status.Reason {
	case "Evicted":
		return kferrors.SystemFailure(kferrors.CodeEvicted, fmt.Sprintf("pod %s was evicted: %s", name, detail), name, at), true
	case "DeadlineExceeded":
		// The pod outlived activeDeadlineSeconds; another attempt may be
		// faster (a slow node), so retryable, but charged to the user.
		f := kferrors.UserError(kferrors.CodeDeadlineExceeded, fmt.Sprintf("pod %s exceeded its active deadline: %s", name, detail), name, at)
		f.Recoverable = true
		return f, true
	case "NodeLost", "Shutdown", "Terminated", "NodeShutdown":
		return kferrors.SystemFailure(kferrors.CodeNodeLost, fmt.Sprintf("pod %s lost its node (%s): %s", name, p.Status.Reason, detail), name, at), true
	}
	if term == nil {
		return kferrors.SystemFailure(kferrors.CodeNodeLost, fmt.Sprintf("pod %s failed without a container exit (%s): %s", name, p.Status.Reason, detail), name, at), true
	}
	e := kferrors.Exit{Worker: name, ExitCode: int(term.ExitCode), ObservedAt: at, OOM: term.Reason == "OOMKilled"}
	if term.Signal != 0 {
		e.Signal = syscall.Signal(term.Signal)
	} else if term.ExitCode > 128 && term.ExitCode < 128+65 && term.Reason != "Completed" {
		// 128+n is how a shell or the runtime reports death by signal n.
		e.Signal = syscall.Signal(term.ExitCode - 128)
	}
	if e.Signal == syscall.SIGTERM {
		e.Preempted = true
	}
	f = kferrors.Classify(e)
	f.Message = fmt.Sprintf("pod %s: %s (container %s: reason %s, exit code %d)", name, f.Message, primary, term.Reason, term.ExitCode)
	return f, true
}

// terminated is the terminated state of the named container (the current
// one, else the last), or of the first terminated container.
func terminated(p *corev1.Pod, primary string) *corev1.ContainerStateTerminated {
	var first *corev1.ContainerStateTerminated
	for i := range p.Status.ContainerStatuses {
		cs := &p.Status.ContainerStatuses[i]
		t := cs.State.Terminated
		if t == nil {
			t = cs.LastTerminationState.Terminated
		}
		if t == nil {
			continue
		}
		if cs.Name == primary {
			return t
		}
		if first == nil {
			first = t
		}
	}
	return first
}
