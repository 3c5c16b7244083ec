package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kfelastic/kfelastic/master/relaunch"
)

// Labels and annotations the owner reads and writes.
const (
	// HostnameLabel is the node label AvoidHost excludes values of.
	HostnameLabel     = "kubernetes.io/hostname"
	jobNameLabel      = "training.kubeflow.org/job-name"
	replicaTypeLabel  = "training.kubeflow.org/replica-type"
	replicaIndexLabel = "training.kubeflow.org/replica-index"
	// CarriedAnnotation on the job records the template edits already made,
	// by decision sequence number (JSON list of carriedRecord), so that a
	// retried or replayed decision — by this master or a restarted one — edits
	// the template once.
	CarriedAnnotation = "kfelastic.io/carried-decisions"
	// maxCarried bounds the record; the oldest entries go first. Template
	// edits are bounded by the relaunch budget and the OOM cap anyway.
	maxCarried = 256
)

// carriedRecord is one template edit, and what the rank's next pod must
// satisfy because of it.
type carriedRecord struct {
	Seq int64  `json:"seq"`
	Pod string `json:"pod"`
	// Memory is the least memory (limit, else request; bytes) the pod must
	// come back with.
	Memory int64 `json:"memory,omitempty"`
	// Host is a node the pod must not come back to.
	Host string `json:"host,omitempty"`
}

// object is a Kubernetes object as decoded JSON (numbers as json.Number).
type object = map[string]any

func child(m object, keys ...string) (object, error) {
	cur := m
	for i, k := range keys {
		next, ok := cur[k].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%w: no %v in the job", ErrJobShape, keys[:i+1])
		}
		cur = next
	}
	return cur, nil
}

// ensure returns m[key] as an object, creating it.
func ensure(m object, key string) object {
	next, ok := m[key].(map[string]any)
	if !ok {
		next = object{}
		m[key] = next
	}
	return next
}

// podSpec is the pod spec of replica type rt's template.
func podSpec(job object, rt string) (object, error) {
	return child(job, "spec", "pytorchReplicaSpecs", rt, "template", "spec")
}

func containerOf(spec object, name string) (object, error) {
	list, _ := spec["containers"].([]any)
	for _, c := range list {
		if c, ok := c.(map[string]any); ok && c["name"] == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w: no container %q in the replica template", ErrJobShape, name)
}

// quantity reads a resource quantity written as a string or a number.
func quantity(v any) (resource.Quantity, bool) {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case json.Number:
		s = v.String()
	case float64:
		s = strconv.FormatFloat(v, 'f', -1, 64)
	default:
		return resource.Quantity{}, false
	}
	q, err := resource.ParseQuantity(s)
	return q, err == nil
}

func memoryOf(list object) (int64, bool) {
	if list == nil {
		return 0, false
	}
	v, present := list["memory"]
	if !present {
		return 0, false
	}
	q, ok := quantity(v)
	return q.Value(), ok
}

func formatMemory(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }

// raiseMemory raises the memory of container in replica type rt's template
// to what one OOM kill of a pod that had base bytes earns (oom.Raised; base
// ≤ 0: the template's own amount), as kfoperator.RaiseReplicaMemory does:
// the limit becomes the target, the request grows by the same policy and
// stays at most the limit; a template with only a request has it raised.
// A template that already has at least the target is left alone (another
// OOM kill raised it). target is what the relaunched pod must have.
func raiseMemory(job object, rt, container string, oom relaunch.OOM, base int64) (target int64, changed bool, err error) {
	spec, err := podSpec(job, rt)
	if err != nil {
		return 0, false, err
	}
	c, err := containerOf(spec, container)
	if err != nil {
		return 0, false, err
	}
	res, _ := c["resources"].(map[string]any)
	limits, _ := res["limits"].(map[string]any)
	requests, _ := res["requests"].(map[string]any)
	limit, hasLimit := memoryOf(limits)
	request, hasRequest := memoryOf(requests)
	current := limit
	if !hasLimit {
		if !hasRequest {
			return 0, false, fmt.Errorf("%w: container %q has no memory request or limit to raise", ErrJobShape, container)
		}
		current = request
	}
	if base <= 0 {
		base = current
	}
	target, ok := oom.Raised(base)
	if !ok {
		return base, false, fmt.Errorf("%w: container %q memory %s cannot grow (factor %g, at most %s)",
			ErrMemoryAtCap, container, formatMemory(base), oom.Factor, formatMemory(oom.Max))
	}
	if current >= target {
		return target, false, nil
	}
	if hasLimit {
		limits["memory"] = formatMemory(target)
		if hasRequest {
			r, ok := oom.Raised(request)
			if !ok {
				r = request
			}
			r = min(r, target)
			if r > request {
				requests["memory"] = formatMemory(r)
			}
		}
	} else {
		requests["memory"] = formatMemory(target)
	}
	return target, true, nil
}

// avoidHost adds host to a required node affinity `kubernetes.io/hostname
// NotIn [...]` in every node selector term of replica type rt's template
// (terms are ORed, so each needs it), creating the affinity if there is
// none. Idempotent: changed is false when every term already excludes host.
func avoidHost(job object, rt, host string) (changed bool, err error) {
	spec, err := podSpec(job, rt)
	if err != nil {
		return false, err
	}
	required := ensure(ensure(ensure(spec, "affinity"), "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution")
	terms, _ := required["nodeSelectorTerms"].([]any)
	if len(terms) == 0 {
		terms = []any{object{}}
	}
	for i, t := range terms {
		term, ok := t.(map[string]any)
		if !ok {
			return false, fmt.Errorf("%w: node selector term %d is not an object", ErrJobShape, i)
		}
		exprs, _ := term["matchExpressions"].([]any)
		done := false
		for _, e := range exprs {
			expr, ok := e.(map[string]any)
			if !ok || expr["key"] != HostnameLabel || expr["operator"] != "NotIn" {
				continue
			}
			values, _ := expr["values"].([]any)
			for _, v := range values {
				if v == host {
					done = true
				}
			}
			if !done {
				expr["values"] = append(values, host)
				changed, done = true, true
			}
			break
		}
		if !done {
			term["matchExpressions"] = append(exprs, object{"key": HostnameLabel, "operator": "NotIn", "values": []any{host}})
			changed = true
		}
	}
	required["nodeSelectorTerms"] = terms
	return changed, nil
}

// carriedOf reads the job's record of carried decisions; a record that is
// not readable (edited by hand) counts as empty.
func carriedOf(job object) []carriedRecord {
	meta, _ := job["metadata"].(map[string]any)
	ann, _ := meta["annotations"].(map[string]any)
	s, _ := ann[CarriedAnnotation].(string)
	var recs []carriedRecord
	if s != "" && json.Unmarshal([]byte(s), &recs) != nil {
		return nil
	}
	return recs
}

func findCarried(recs []carriedRecord, seq int64) (carriedRecord, bool) {
	for _, r := range recs {
		if r.Seq == seq {
			return r, true
		}
	}
	return carriedRecord{}, false
}

// addCarried records rec in the job's annotation, keeping the newest
// maxCarried by sequence number.
func addCarried(job object, rec carriedRecord) {
	recs := append(carriedOf(job), rec)
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Seq < recs[j].Seq })
	if len(recs) > maxCarried {
		recs = recs[len(recs)-maxCarried:]
	}
	b, _ := json.Marshal(recs)
	ensure(ensure(job, "metadata"), "annotations")[CarriedAnnotation] = string(b)
}

// Errors Carry returns that a retry cannot fix (see Permanent).
var (
	// ErrMemoryAtCap: an OOM-killed pod's memory cannot grow (the policy's
	// cap, or a factor ≤ 1); nothing was changed.
	ErrMemoryAtCap = errors.New("kube: memory at the OOM cap")
	// ErrInvalidAction: the action names no pod of this job, a kind the
	// owner does not carry out, or lacks what its kind needs.
	ErrInvalidAction = errors.New("kube: invalid action")
	// ErrJobShape: the job is not a PyTorchJob as expected (no such replica
	// type or container, no memory to raise).
	ErrJobShape = errors.New("kube: unexpected job")
	// ErrNoHost: AvoidHost for a pod whose node is unknown.
	ErrNoHost = errors.New("kube: no host to avoid")
)

// Permanent reports whether err from Carry is one that a retry cannot fix:
// the action or the job is wrong, memory is at its cap, or the API server
// refuses for good (400, 405; 403 Forbidden: the Role lacks a permission; 404: the job
// is gone; 422: the edit is invalid). Other errors (network, 409 beyond the
// owner's own retries, 5xx, 429) are worth retrying.
func Permanent(err error) bool {
	if errors.Is(err, ErrMemoryAtCap) || errors.Is(err, ErrInvalidAction) || errors.Is(err, ErrJobShape) || errors.Is(err, ErrNoHost) {
		return true
	}
	var e *APIError
	if errors.As(err, &e) {
		switch e.Code {
		case 400, 403, 404, 405, 422:
			return true
		}
	}
	return false
}
