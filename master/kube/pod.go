package kube

import (
	"strconv"
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
	Name      string         `json:"name"`
	State     containerState `json:"state"`
	LastState containerState `json:"lastState"`
}

type containerState struct {
	Terminated *terminatedState `json:"terminated"`
}

type terminatedState struct {
	ExitCode   int        `json:"exitCode"`
	Signal     int        `json:"signal"`
	Reason     string     `json:"reason"`
	Message    string     `json:"message"`
	FinishedAt *time.Time `json:"finishedAt"`
}

// objectList is a list the API server answers: its items and the
// resource version to watch from.
type objectList[T any] struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []T `json:"items"`
}

type podList = objectList[pod]

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
// pod that died without its agent saying so, by kferrors.ClassifyPod.
// deleted: the pod is being or has been deleted, and not by the owner
// itself (a deletion by the owner carries out a decision and is not
// reported). ok is false for a pod that is alive or ended well. Pure: now
// is the fallback time.
func classify(p *pod, container string, deleted bool, now time.Time) (g PodGone, ok bool) {
	s := kferrors.PodStatus{Name: p.Metadata.Name, Node: p.Spec.NodeName, Phase: p.Status.Phase, Reason: p.Status.Reason,
		Message: p.Status.Message, Disruption: p.disruption(), Deleted: deleted, Primary: container, Memory: p.memory(container),
		InitContainers: statuses(p.Status.InitContainerStatuses), Containers: statuses(p.Status.ContainerStatuses)}
	for _, c := range p.Status.Conditions {
		if c.LastTransitionTime != nil && c.LastTransitionTime.After(s.LastTransition) {
			s.LastTransition = *c.LastTransitionTime
		}
	}
	if m := p.Metadata; m.DeletionTimestamp != nil && m.DeletionGracePeriodSeconds != nil {
		s.DeletionStart = m.DeletionTimestamp.Add(-time.Duration(*m.DeletionGracePeriodSeconds) * time.Second)
	}
	g = PodGone{Pod: p.Metadata.Name, UID: p.Metadata.UID, Index: p.index(), Node: p.Spec.NodeName}
	g.Failure, ok = kferrors.ClassifyPod(s, now)
	return g, ok
}

func statuses(list []containerStatus) []kferrors.ContainerStatus {
	out := make([]kferrors.ContainerStatus, len(list))
	for i, cs := range list {
		out[i] = kferrors.ContainerStatus{Name: cs.Name, Terminated: cs.State.Terminated.termination(), LastTerminated: cs.LastState.Terminated.termination()}
	}
	return out
}

func (t *terminatedState) termination() *kferrors.Termination {
	if t == nil {
		return nil
	}
	k := &kferrors.Termination{ExitCode: t.ExitCode, Signal: t.Signal, Reason: t.Reason}
	if t.FinishedAt != nil {
		k.FinishedAt = *t.FinishedAt
	}
	return k
}
