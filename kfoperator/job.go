package kfoperator

import (
	"fmt"
	"sort"
	"strings"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Job is what the phase mapping needs of a PyTorchJob or TFJob.
type Job struct {
	Kind      string
	Meta      metav1.ObjectMeta
	RunPolicy kubeflowv1.RunPolicy
	Replicas  map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaSpec
	Status    kubeflowv1.JobStatus
}

// JobOf reads a PyTorchJob or TFJob.
func JobOf(obj client.Object) (Job, error) {
	switch j := obj.(type) {
	case *kubeflowv1.PyTorchJob:
		return Job{kubeflowv1.PyTorchJobKind, j.ObjectMeta, j.Spec.RunPolicy, j.Spec.PyTorchReplicaSpecs, j.Status}, nil
	case *kubeflowv1.TFJob:
		return Job{kubeflowv1.TFJobKind, j.ObjectMeta, j.Spec.RunPolicy, j.Spec.TFReplicaSpecs, j.Status}, nil
	default:
		return Job{}, fmt.Errorf("kfoperator: %T is neither a PyTorchJob nor a TFJob", obj)
	}
}

// CurrentCondition is the most recent condition whose status is True (the
// one the operator last moved to), without reordering the job's slice. Ties
// go to the later entry, as the operator appends.
func (j Job) CurrentCondition() (kubeflowv1.JobCondition, bool) {
	var cur kubeflowv1.JobCondition
	found := false
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		if !found || !c.LastTransitionTime.Time.Before(cur.LastTransitionTime.Time) {
			cur, found = c, true
		}
	}
	return cur, found
}

// Terminal returns the terminal condition (Succeeded or Failed), if any.
func (j Job) Terminal() (kubeflowv1.JobCondition, bool) {
	c, ok := j.CurrentCondition()
	if ok && (c.Type == kubeflowv1.JobSucceeded || c.Type == kubeflowv1.JobFailed) {
		return c, true
	}
	return kubeflowv1.JobCondition{}, false
}

// FailedInStatus is the number of failed pods the operator counted.
func (j Job) FailedInStatus() int {
	n := 0
	for _, rs := range j.Status.ReplicaStatuses {
		if rs != nil {
			n += int(rs.Failed)
		}
	}
	return n
}

// LogPod is a pod a log link points at.
type LogPod struct {
	Name    string
	Replica kubeflowv1.ReplicaType
	Index   int
}

// replicaOrder is the order of log links: the coordinating replica first.
var replicaOrder = []kubeflowv1.ReplicaType{
	kubeflowv1.PyTorchJobReplicaTypeMaster,
	kubeflowv1.TFJobReplicaTypeChief,
	kubeflowv1.PyTorchJobReplicaTypeWorker,
	kubeflowv1.TFJobReplicaTypePS,
	kubeflowv1.TFJobReplicaTypeEval,
}

// LogPods names the pods of a job as the training operator names them,
// <job>-<lowercase replica type>-<index>, for every replica the job asks for.
// (Upstream links TF pods as -psReplica-<i>, -chiefReplica-0,
// -evaluatorReplica-0, names no pod has.)
func (j Job) LogPods() []LogPod {
	var out []LogPod
	seen := map[kubeflowv1.ReplicaType]bool{}
	types := append([]kubeflowv1.ReplicaType{}, replicaOrder...)
	var rest []kubeflowv1.ReplicaType
	for t := range j.Replicas {
		rest = append(rest, t)
	}
	sort.Slice(rest, func(a, b int) bool { return rest[a] < rest[b] })
	types = append(types, rest...)
	for _, t := range types {
		rs := j.Replicas[t]
		if seen[t] || rs == nil {
			continue
		}
		seen[t] = true
		n := 1
		if rs.Replicas != nil {
			n = int(*rs.Replicas)
		}
		for i := 0; i < n; i++ {
			out = append(out, LogPod{Name: fmt.Sprintf("%s-%s-%d", j.Meta.Name, strings.ToLower(string(t)), i), Replica: t, Index: i})
		}
	}
	return out
}
