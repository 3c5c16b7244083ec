package kube

import (
	"fmt"
	"strconv"
	"syscall"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"

	"k8s.io/apimachinery/pkg/api/resource"
)

// pod is the part of a core/v1 Pod the owner reads.
type pod struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		NodeName   string `json:"nodeName"`
		Containers []struct {
			Name      string `json:"name"`
			Resources struct {
				Limits   map[string]string `json:"limits"`
				Requests map[string]string `json:"requests"`
			} `json:"resources"`
		} `json:"containers"`
		Affinity *struct {
			NodeAffinity *struct {
				Required *struct {
					Terms []struct {
						MatchExpressions []nodeSelectorRequirement `json:"matchExpressions"`
					} `json:"nodeSelectorTerms"`
				} `json:"requiredDuringSchedulingIgnoredDuringExecution"`
			} `json:"nodeAffinity"`
		} `json:"affinity"`
	} `json:"spec"`
	Status struct {
		Phase      string `json:"phase"`
		Reason     string `json:"reason"`
		Message    string `json:"message"`
		Conditions []struct {
			Type               string     `json:"type"`
			Status             string     `json:"status"`
			Reason             string     `json:"reason"`
			Message            string     `json:"message"`
			LastTransitionTime *time.Time `json:"lastTransitionTime"`
		} `json:"conditions"`
		ContainerStatuses     []containerStatus `json:"containerStatuses"`
		InitContainerStatuses []containerStatus `json:"initContainerStatuses"`
	} `json:"status"`
}

type objectMeta struct {
	Name                       string            `json:"name"`
	Namespace                  string            `json:"namespace"`
	UID                        string            `json:"uid"`
	ResourceVersion            string            `json:"resourceVersion"`
	Labels                     map[string]string `json:"labels"`
	CreationTimestamp          time.Time         `json:"creationTimestamp"`
	DeletionTimestamp          *time.Time        `json:"deletionTimestamp"`
	DeletionGracePeriodSeconds *int64            `json:"deletionGracePeriodSeconds"`
}

type nodeSelectorRequirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values"`
}

type containerStatus struct {
	Name  string `json:"name"`
	State struct {
		Terminated *terminatedState `json:"terminated"`
	} `json:"state"`
}

type terminatedState struct {
	ExitCode   int        `json:"exitCode"`
	Signal     int        `json:"signal"`
	Reason     string     `json:"reason"`
	Message    string     `json:"message"`
	FinishedAt *time.Time `json:"finishedAt"`
}

type podList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []pod `json:"items"`
}

// memory is a container's memory as the OOM policy sees it: its limit, or
// its request where it has no limit; 0 if neither (or unparsable).
func (p *pod) memory(container string) int64 {
	for _, c := range p.Spec.Containers {
		if c.Name != container {
			continue
		}
		v := c.Resources.Limits["memory"]
		if v == "" {
			v = c.Resources.Requests["memory"]
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return 0
		}
		return q.Value()
	}
	return 0
}

// avoids reports whether the pod's required node affinity keeps it off host
// (a hostname NotIn requirement in every term).
func (p *pod) avoids(host string) bool {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.Required == nil || len(a.NodeAffinity.Required.Terms) == 0 {
		return false
	}
	for _, t := range a.NodeAffinity.Required.Terms {
		found := false
		for _, r := range t.MatchExpressions {
			if r.Key == HostnameLabel && r.Operator == "NotIn" && contains(r.Values, host) {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// index is the pod's replica index (the operator's replica-index label).
func (p *pod) index() int {
	i, err := strconv.Atoi(p.Metadata.Labels[replicaIndexLabel])
	if err != nil {
		return -1
	}
	return i
}

// nodeLost reports whether the pod's node is gone by the pod's own status:
// phase Unknown, reason NodeLost, or the taint manager / pod GC deleting it.
func (p *pod) nodeLost() bool {
	if p.Status.Phase == "Unknown" || p.Status.Reason == "NodeLost" {
		return true
	}
	switch p.disruption() {
	case "DeletionByTaintManager", "DeletionByPodGC":
		return true
	}
	return false
}

// disruption is the reason of the pod's DisruptionTarget condition (Kubernetes
// ≥ 1.26 sets it on a pod about to be terminated by the system), or "".
func (p *pod) disruption() string {
	for _, c := range p.Status.Conditions {
		if c.Type == "DisruptionTarget" && c.Status == "True" {
			return c.Reason
		}
	}
	return ""
}

// classify maps a pod's state to the failure the master should hear of, for a
// pod that died without its agent saying so. deleted: the pod is being or
// has been deleted, and not by the owner itself (a deletion by the owner
// carries out a decision and is not reported). ok is false for a pod that is
// alive or ended well. Pure: now is the fallback time.
//
// Order: what the runtime says of the primary container's death (OOMKilled)
// wins, then what the system says of the pod (evicted, node lost, preempted
// by the scheduler), then an outside deletion (Preempted), then the
// container's exit code (≥128: a signal, 128+n; 1–127: the user's error,
// not recoverable).
func classify(p *pod, container string, deleted bool, now time.Time) (g PodGone, ok bool) {
	g = PodGone{Pod: p.Metadata.Name, UID: p.Metadata.UID, Index: p.index(), Node: p.Spec.NodeName}
	g.Time = now
	if p.Status.Phase == "Succeeded" {
		return g, false
	}
	term := terminated(p, container)
	if t := p.lastTransition(); !t.IsZero() {
		g.Time = t
	}
	if term != nil && term.FinishedAt != nil && !term.FinishedAt.IsZero() {
		g.Time = *term.FinishedAt
	}
	sys := func(code, format string, args ...any) (PodGone, bool) {
		g.Code, g.Recoverable = code, true
		g.Message = fmt.Sprintf("pod %s ", g.Pod) + fmt.Sprintf(format, args...)
		return g, true
	}
	if term != nil && term.Reason == "OOMKilled" {
		return sys(kferrors.CodeOOMKilled, "was OOM-killed (container %s, exit code %d, memory %s)", container, term.ExitCode, formatBytes(p.memory(container)))
	}
	detail := p.Status.Message
	switch p.Status.Reason {
	case "Evicted":
		return sys(kferrors.CodeEvicted, "was evicted: %s", detail)
	case "NodeLost", "Shutdown", "Terminated", "NodeShutdown":
		return sys(kferrors.CodeNodeLost, "lost its node %s (%s): %s", p.Spec.NodeName, p.Status.Reason, detail)
	case "DeadlineExceeded":
		return sys(kferrors.CodeDeadlineExceeded, "exceeded its active deadline: %s", detail)
	}
	if p.Status.Phase == "Unknown" {
		return sys(kferrors.CodeNodeLost, "is in phase Unknown: its node %s stopped reporting", p.Spec.NodeName)
	}
	switch r := p.disruption(); r {
	case "EvictionByEvictionAPI", "TerminationByKubelet":
		return sys(kferrors.CodeEvicted, "was evicted (%s)", r)
	case "PreemptionByScheduler", "PreemptionByKubeScheduler":
		return sys(kferrors.CodePreempted, "was preempted by the scheduler (%s)", r)
	case "DeletionByTaintManager", "DeletionByPodGC":
		return sys(kferrors.CodeNodeLost, "is deleted because its node %s is gone (%s)", p.Spec.NodeName, r)
	}
	if term == nil || (term.ExitCode == 0 && term.Signal == 0) {
		switch {
		case deleted && p.Status.Phase == "Pending" && term == nil:
			// Deleted before it ever ran: it had no agent and held no rank,
			// so there is nothing to relaunch or count (the training
			// operator replaces it, and deletes its own extras this way).
			return g, false
		case deleted:
			if p.Metadata.DeletionTimestamp != nil && p.Metadata.DeletionGracePeriodSeconds != nil && term == nil {
				g.Time = p.Metadata.DeletionTimestamp.Add(-time.Duration(*p.Metadata.DeletionGracePeriodSeconds) * time.Second)
			}
			return sys(kferrors.CodePreempted, "was deleted from outside while %s", orUnknown(p.Status.Phase))
		case p.Status.Phase == "Failed":
			return sys(kferrors.CodeNodeLost, "failed without a container exit (%s): %s", p.Status.Reason, detail)
		}
		return g, false
	}
	code := term.ExitCode
	sig := term.Signal
	if sig == 0 && code > 128 {
		sig = code - 128 // how a shell or the runtime reports death by signal n
	}
	switch {
	case sig == 15:
		return sys(kferrors.CodePreempted, "was terminated by SIGTERM from outside (exit code %d)", code)
	case sig != 0:
		return sys(kferrors.SignalCode(syscall.Signal(sig)), "was killed by signal %d (%s), exit code %d", sig, kferrors.SignalName(syscall.Signal(sig)), code)
	}
	g.Code, g.Recoverable = kferrors.CodeNonZeroExit, false
	g.Message = fmt.Sprintf("pod %s exited with code %d (container %s, reason %s)", g.Pod, code, container, term.Reason)
	return g, true
}

func orUnknown(s string) string {
	if s == "" {
		return "in an unknown phase"
	}
	return s
}

// lastTransition is the latest condition transition time, or zero.
func (p *pod) lastTransition() time.Time {
	var at time.Time
	for _, c := range p.Status.Conditions {
		if c.LastTransitionTime != nil && c.LastTransitionTime.After(at) {
			at = *c.LastTransitionTime
		}
	}
	return at
}

// terminated is the terminated state of the named container, else of the
// first container (or init container) that ended non-zero; nil if none.
func terminated(p *pod, container string) *terminatedState {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container && cs.State.Terminated != nil {
			return cs.State.Terminated
		}
	}
	for _, list := range [][]containerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			if t := cs.State.Terminated; t != nil && (t.ExitCode != 0 || t.Signal != 0 || t.Reason == "OOMKilled") {
				return t
			}
		}
	}
	return nil
}

func formatBytes(b int64) string {
	if b <= 0 {
		return "unknown"
	}
	return resource.NewQuantity(b, resource.BinarySI).String()
}
