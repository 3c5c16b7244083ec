package kfoperator

import (
	"testing"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

var dlrover = OOMPolicy{Factor: 2, MaxIncrement: resource.MustParse("8Gi"), Max: resource.MustParse("64Gi")}

func TestRaisedMemory(t *testing.T) {
	for in, want := range map[string]string{
		"1Gi":   "2Gi",
		"6Gi":   "12Gi",
		"10Gi":  "18Gi", // +8Gi at most
		"60Gi":  "64Gi", // capped
		"512Mi": "1Gi",
	} {
		got, ok := dlrover.RaisedMemory(resource.MustParse(in))
		if !ok || got.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("%s → %s (%v), want %s", in, got.String(), ok, want)
		}
	}
	if _, ok := dlrover.RaisedMemory(resource.MustParse("64Gi")); ok {
		t.Errorf("raised past the cap")
	}
}

func TestRaiseReplicaMemory(t *testing.T) {
	spec := &kubeflowv1.ReplicaSpec{}
	spec.Template.Spec.Containers = []corev1.Container{{Name: "tensorflow", Resources: corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
	}}}
	got, err := RaiseReplicaMemory(spec, "tensorflow", dlrover)
	if err != nil || got.Cmp(resource.MustParse("4Gi")) != 0 {
		t.Fatalf("%v %v", got.String(), err)
	}
	r := spec.Template.Spec.Containers[0].Resources
	if l, q := r.Limits[corev1.ResourceMemory], r.Requests[corev1.ResourceMemory]; l.Cmp(resource.MustParse("4Gi")) != 0 || q.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("limit %s request %s", l.String(), q.String())
	}
	if _, err := RaiseReplicaMemory(spec, "pytorch", dlrover); err == nil {
		t.Errorf("raised a container that does not exist")
	}
}
