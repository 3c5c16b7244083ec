package kfoperator

import (
	"fmt"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kfelastic/kfelastic/master/relaunch"
)

// OOMPolicy is how much memory a replica relaunched after an OOM kill gets
// (docs/DESIGN.md §5.5, DLRover's figures as defaults: ×2, at most +8 GiB, at most
// 64 GiB).
type OOMPolicy struct {
	Factor       float64
	MaxIncrement resource.Quantity
	Max          resource.Quantity
}

// RaisedMemory is the memory after one OOM: current×Factor, raised by no
// more than MaxIncrement, capped at Max (relaunch.OOM, the master's own
// arithmetic). ok is false when it cannot grow (already at the cap):
// relaunching would OOM again.
func (p OOMPolicy) RaisedMemory(current resource.Quantity) (resource.Quantity, bool) {
	next, ok := relaunch.OOM{Factor: p.Factor, MaxIncrement: p.MaxIncrement.Value(), Max: p.Max.Value()}.Raised(current.Value())
	if !ok {
		return current, false
	}
	return *resource.NewQuantity(next, resource.BinarySI), true
}

// RaiseReplicaMemory applies the policy to the primary container of one
// replica template, in place: the memory limit (and the request, kept at
// most the limit and raised by the same factor) grow. This is the patch
// the kfelastic master sends before deleting the OOM-killed pod, so that the
// training operator recreates it from the bigger template. It returns the
// new limit.
func RaiseReplicaMemory(spec *kubeflowv1.ReplicaSpec, container string, p OOMPolicy) (resource.Quantity, error) {
	for i := range spec.Template.Spec.Containers {
		c := &spec.Template.Spec.Containers[i]
		if c.Name != container {
			continue
		}
		limit, hasLimit := c.Resources.Limits[corev1.ResourceMemory]
		request, hasRequest := c.Resources.Requests[corev1.ResourceMemory]
		base := limit
		if !hasLimit {
			if !hasRequest {
				return resource.Quantity{}, fmt.Errorf("container %q has no memory request or limit to raise", container)
			}
			base = request
		}
		next, ok := p.RaisedMemory(base)
		if !ok {
			return base, fmt.Errorf("container %q memory %s is at the OOM cap %s", container, base.String(), p.Max.String())
		}
		if hasLimit {
			c.Resources.Limits[corev1.ResourceMemory] = next
		}
		if hasRequest {
			r, _ := p.RaisedMemory(request)
			if r.Cmp(next) > 0 {
				r = next
			}
			c.Resources.Requests[corev1.ResourceMemory] = r
		}
		return next, nil
	}
	return resource.Quantity{}, fmt.Errorf("no container %q in the replica template", container)
}
