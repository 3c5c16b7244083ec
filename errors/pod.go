package errors

import (
	"fmt"
	"strconv"
	"syscall"
	"time"
)

// PodStatus is what ClassifyPod reads of a pod: the parts of a Kubernetes
// core/v1 Pod that say how it ended, as plain values, so that this package
// links no Kubernetes types. The plugin fills it from a corev1.Pod
// (kfoperator.Synthesize), the master from the JSON its pod watch decodes
// (master/kube); a few lines each.
type PodStatus struct {
	Name string
	// Node is spec.nodeName.
	Node string
	// Phase, Reason and Message are status.phase, .reason and .message.
	Phase, Reason, Message string
	// Disruption is the reason of the pod's DisruptionTarget condition
	// when its status is True (Kubernetes ≥ 1.26 sets it on a pod the
	// system is about to terminate), else "".
	Disruption string
	// LastTransition is the latest lastTransitionTime of the pod's
	// conditions, zero if none.
	LastTransition time.Time
	// Deleted: the pod is being or has been deleted, and not by its owner
	// (a deletion by the owner carries out a decision: not a failure).
	Deleted bool
	// DeletionStart is when that deletion began (deletionTimestamp minus
	// the grace period), zero if unknown.
	DeletionStart time.Time
	// Primary is the training container's name; Memory its memory limit,
	// else its request, in bytes (0 if unknown).
	Primary string
	Memory  int64
	// InitContainers and Containers are the pod's container statuses.
	InitContainers, Containers []ContainerStatus
}

// ContainerStatus is one container's end: its current state's and its
// last state's terminated part, nil where it has none.
type ContainerStatus struct {
	Name                       string
	Terminated, LastTerminated *Termination
}

// Termination is a container's terminated state.
type Termination struct {
	ExitCode int
	// Signal is the signal the runtime says ended the container, 0 if none
	// (the runtimes in use report a signal as exit code 128+N instead).
	Signal     int
	Reason     string
	FinishedAt time.Time
}

// Kubernetes' words for how a pod or container ended.
const (
	podSucceeded     = "Succeeded"
	podFailed        = "Failed"
	podPending       = "Pending"
	podUnknown       = "Unknown"
	reasonOOMKilled  = "OOMKilled"
	reasonEvicted    = "Evicted"
	reasonDeadline   = "DeadlineExceeded"
	reasonNodeLost   = "NodeLost"
	reasonNodeDown   = "Shutdown"
	reasonNodeGone   = "Terminated"
	reasonNodeHalted = "NodeShutdown"
)

// ClassifyPod is the one rule "a dead pod's status → its failure", for a
// pod that left no error document (the plugin) or died without its agent
// telling the master (the master's pod watch). ok is false for a pod that
// is alive, succeeded, or was deleted before it ever ran. Pure: fallback
// stands in for a time the status does not give (the plugin passes the
// job's terminal time, the master the time it saw the pod).
//
// The failure's time is the container's finish time, else the pod's last
// condition transition, else fallback: never 1970. Pod statuses carry
// whole seconds, so a synthesized failure ranks at the start of its second.
// Worker is the pod's name, as _F_WN gives it.
//
// The order, decided once for the plugin and the master (they had drifted):
//  1. OOMKilled, the runtime's word on the container's death, comes first,
//     even before the pod's own reason (an OOM-killed container of a pod
//     evicted later is OOMKilled): it is the cause a user can act on, and
//     the relaunch policy answers it with more memory.
//  2. The pod's reason: Evicted; NodeLost (NodeLost, and the graceful node
//     shutdown's Shutdown, Terminated, NodeShutdown); DeadlineExceeded.
//     DeadlineExceeded is USER and recoverable: the pod outlived the
//     activeDeadlineSeconds its spec sets, as flyteplugins charges it to the
//     user (a retryable user failure), and another attempt may be faster.
//  3. Phase Unknown: its node stopped reporting (NodeLost).
//  4. The DisruptionTarget condition: Evicted (eviction API, kubelet),
//     Preempted (scheduler), NodeLost (taint manager, pod GC).
//  5. No container exit: deleted from outside is Preempted; Failed is
//     NodeLost (the pod failed without a container exit, a system cause).
//  6. The container's exit, read back by CodeOfExit: 128+N for N a Linux
//     signal (129–192), or the runtime's signal field, is Signal<NAME>
//     (SIGTERM: Preempted); the agent's own 200–204 are NodeCheckFailed,
//     Straggler, RendezvousTimeout, Hang and USER:Recoverable, never a
//     signal (exit 200 is not SIGRTMAX+8); any other code is the user's
//     NonZeroExit.
//
// The container is the primary one (its current termination, else, once
// the pod has Failed, its last one), else the first container, init
// containers first, that ended badly (non-zero, signal, OOMKilled).
func ClassifyPod(p PodStatus, fallback time.Time) (f Failure, ok bool) {
	if p.Phase == podSucceeded {
		return Failure{}, false
	}
	name := p.Name
	container, term := p.ended()
	at := fallback
	if !p.LastTransition.IsZero() {
		at = p.LastTransition
	}
	if term != nil && !term.FinishedAt.IsZero() {
		at = term.FinishedAt
	}
	system := func(code, format string, args ...any) (Failure, bool) {
		return SystemFailure(code, "pod "+name+" "+fmt.Sprintf(format, args...), name, at), true
	}
	var exit string // the container's end, for the message
	if term != nil {
		exit = fmt.Sprintf("container %s: reason %s, exit code %d", container, term.Reason, term.ExitCode)
	}
	if term != nil && term.Reason == reasonOOMKilled {
		return system(CodeOOMKilled, "was OOM-killed (%s, memory %s)", exit, bytesText(p.Memory))
	}
	switch p.Reason {
	case reasonEvicted:
		return system(CodeEvicted, "was evicted: %s", p.Message)
	case reasonNodeLost, reasonNodeDown, reasonNodeGone, reasonNodeHalted:
		return system(CodeNodeLost, "lost its node %s (%s): %s", p.Node, p.Reason, p.Message)
	case reasonDeadline:
		f := UserError(CodeDeadlineExceeded, fmt.Sprintf("pod %s exceeded its active deadline: %s", name, p.Message), name, at)
		f.Recoverable = true
		return f, true
	}
	if p.Phase == podUnknown {
		return system(CodeNodeLost, "is in phase Unknown: its node %s stopped reporting", p.Node)
	}
	switch r := p.Disruption; r {
	case "EvictionByEvictionAPI", "TerminationByKubelet":
		return system(CodeEvicted, "was evicted (%s)", r)
	case "PreemptionByScheduler", "PreemptionByKubeScheduler":
		return system(CodePreempted, "was preempted by the scheduler (%s)", r)
	case "DeletionByTaintManager", "DeletionByPodGC":
		return system(CodeNodeLost, "is deleted because its node %s is gone (%s)", p.Node, r)
	}
	if term == nil || (term.ExitCode == 0 && term.Signal == 0) {
		switch {
		case p.Deleted && p.Phase == podPending && term == nil:
			// Deleted before it ever ran: it had no agent and held no rank,
			// so there is nothing to relaunch or count (the training
			// operator replaces it, and deletes its own extras this way).
			return Failure{}, false
		case p.Deleted:
			if term == nil && !p.DeletionStart.IsZero() {
				at = p.DeletionStart
			}
			return system(CodePreempted, "was deleted from outside while %s", orUnknown(p.Phase))
		case p.Phase == podFailed:
			return system(CodeNodeLost, "failed without a container exit (%s): %s", p.Reason, p.Message)
		}
		return Failure{}, false
	}
	status := term.ExitCode
	if term.Signal > 0 && term.Signal <= maxSignal {
		status = 128 + term.Signal
	}
	switch code := CodeOfExit(status); code {
	case CodePreempted:
		return system(code, "was terminated by SIGTERM from outside (%s)", exit)
	case CodeNonZeroExit:
		return UserError(code, fmt.Sprintf("pod %s exited with code %d (%s)", name, term.ExitCode, exit), name, at), true
	case CodeRecoverable:
		f := UserError(code, fmt.Sprintf("pod %s: its agent exited with code %d, a recoverable failure (%s)", name, status, exit), name, at)
		f.Recoverable = true
		return f, true
	default:
		if sig := status - 128; sig <= maxSignal {
			return system(code, "was killed by signal %d (%s) (%s)", sig, SignalName(syscall.Signal(sig)), exit)
		}
		return system(code, "failed: its agent exited with code %d, %s (%s)", status, code, exit)
	}
}

// ended is the container whose end tells the pod's: see ClassifyPod.
func (p PodStatus) ended() (name string, t *Termination) {
	for _, c := range p.Containers {
		if c.Name != p.Primary {
			continue
		}
		if c.Terminated != nil {
			return c.Name, c.Terminated
		}
		if c.LastTerminated != nil && p.Phase == podFailed {
			return c.Name, c.LastTerminated
		}
	}
	for _, list := range [][]ContainerStatus{p.InitContainers, p.Containers} {
		for _, c := range list {
			if t := c.Terminated; t != nil && (t.ExitCode != 0 || t.Signal != 0 || t.Reason == reasonOOMKilled) {
				return c.Name, t
			}
		}
	}
	return "", nil
}

func orUnknown(phase string) string {
	if phase == "" {
		return "in an unknown phase"
	}
	return phase
}

// bytesText writes a memory size as Kubernetes does (resource.Quantity,
// binary SI): 1Gi, 1536Mi, 1000; "unknown" for none.
func bytesText(b int64) string {
	if b <= 0 {
		return "unknown"
	}
	units := []string{"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}
	i := 0
	for b%1024 == 0 && i < len(units)-1 {
		b /= 1024
		i++
	}
	return strconv.FormatInt(b, 10) + units[i]
}
