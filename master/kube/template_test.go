package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kfelastic/kfelastic/kfoperator"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

const Gi = 1 << 30

// jobWith is a PyTorchJob as the API server returns it, decoded as the
// owner decodes it, with the Worker template's pod spec given as JSON.
func jobWith(t *testing.T, podSpec string) object {
	t.Helper()
	s := `{"apiVersion":"kubeflow.org/v1","kind":"PyTorchJob","metadata":{"name":"j","resourceVersion":"7"},
		"spec":{"pytorchReplicaSpecs":{"Worker":{"replicas":2,"restartPolicy":"ExitCode","template":{"spec":` + podSpec + `}}}}}`
	var job object
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if err := dec.Decode(&job); err != nil {
		t.Fatal(err)
	}
	return job
}

func container(resources string) string {
	return `{"containers":[{"name":"sidecar","image":"s"},{"name":"pytorch","image":"x","resources":` + resources + `}]}`
}

// templatePod is the Worker template's pod spec read back as the owner
// reads pods, to check the edits with the same code that judges pods.
func templatePod(t *testing.T, job object) *pod {
	t.Helper()
	spec, err := podSpec(job, "Worker")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(map[string]any{"spec": spec})
	if err != nil {
		t.Fatal(err)
	}
	var p pod
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func resourcesOf(t *testing.T, job object) (limit, request string) {
	t.Helper()
	spec, _ := podSpec(job, "Worker")
	c, err := containerOf(spec, "pytorch")
	if err != nil {
		t.Fatal(err)
	}
	res, _ := c["resources"].(map[string]any)
	l, _ := res["limits"].(map[string]any)
	r, _ := res["requests"].(map[string]any)
	return fmt.Sprint(l["memory"]), fmt.Sprint(r["memory"])
}

func TestRaiseMemory(t *testing.T) {
	oom := relaunch.DefaultOOM // ×2, at most +8 GiB, at most 64 GiB
	for _, tc := range []struct {
		name                   string
		resources              string
		base                   int64
		target                 int64
		changed                bool
		wantLimit, wantRequest string
		err                    error
	}{
		{name: "limit and request double", resources: `{"limits":{"memory":"1Gi","cpu":"1"},"requests":{"memory":"512Mi"}}`,
			target: 2 * Gi, changed: true, wantLimit: "2Gi", wantRequest: "1Gi"},
		{name: "request stays at most the limit", resources: `{"limits":{"memory":"1Gi"},"requests":{"memory":"1Gi"}}`,
			target: 2 * Gi, changed: true, wantLimit: "2Gi", wantRequest: "2Gi"},
		{name: "limit only", resources: `{"limits":{"memory":"3Gi"}}`, target: 6 * Gi, changed: true, wantLimit: "6Gi", wantRequest: "<nil>"},
		{name: "request only", resources: `{"requests":{"memory":"1Gi"}}`, target: 2 * Gi, changed: true, wantLimit: "<nil>", wantRequest: "2Gi"},
		{name: "a number of bytes", resources: `{"limits":{"memory":1073741824}}`, target: 2 * Gi, changed: true, wantLimit: "2Gi", wantRequest: "<nil>"},
		{name: "decimal units", resources: `{"limits":{"memory":"1G"}}`, target: 2e9, changed: true, wantLimit: "1953125Ki", wantRequest: "<nil>"},
		{name: "increment capped", resources: `{"limits":{"memory":"20Gi"}}`, target: 28 * Gi, changed: true, wantLimit: "28Gi", wantRequest: "<nil>"},
		{name: "total capped", resources: `{"limits":{"memory":"60Gi"}}`, target: 64 * Gi, changed: true, wantLimit: "64Gi", wantRequest: "<nil>"},
		{name: "from the failed pod's memory", resources: `{"limits":{"memory":"1Gi"}}`, base: 2 * Gi,
			target: 4 * Gi, changed: true, wantLimit: "4Gi", wantRequest: "<nil>"},
		{name: "template already raised by another OOM", resources: `{"limits":{"memory":"2Gi"}}`, base: Gi,
			target: 2 * Gi, changed: false, wantLimit: "2Gi", wantRequest: "<nil>"},
		{name: "at the cap", resources: `{"limits":{"memory":"64Gi"}}`, err: ErrMemoryAtCap, wantLimit: "64Gi", wantRequest: "<nil>"},
		{name: "no memory", resources: `{"limits":{"cpu":"1"}}`, err: ErrJobShape, wantLimit: "<nil>", wantRequest: "<nil>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := jobWith(t, container(tc.resources))
			before, _ := json.Marshal(job)
			target, changed, err := raiseMemory(job, "Worker", "pytorch", oom, tc.base)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err != nil {
				if after, _ := json.Marshal(job); string(after) != string(before) {
					t.Errorf("the job changed on error:\n%s\n%s", before, after)
				}
				return
			}
			if target != tc.target || changed != tc.changed {
				t.Errorf("target %d changed %v, want %d %v", target, changed, tc.target, tc.changed)
			}
			if l, r := resourcesOf(t, job); l != tc.wantLimit || r != tc.wantRequest {
				t.Errorf("limit %s request %s, want %s %s", l, r, tc.wantLimit, tc.wantRequest)
			}
			if got := templatePod(t, job).memory("pytorch"); got != max(tc.target, 0) {
				t.Errorf("the template's memory as a pod would have it: %d, want %d", got, tc.target)
			}
		})
	}
	t.Run("missing container", func(t *testing.T) {
		job := jobWith(t, `{"containers":[{"name":"other"}]}`)
		if _, _, err := raiseMemory(job, "Worker", "pytorch", oom, 0); !errors.Is(err, ErrJobShape) {
			t.Fatal(err)
		}
		if _, _, err := raiseMemory(job, "Chief", "pytorch", oom, 0); !errors.Is(err, ErrJobShape) {
			t.Fatal(err)
		}
	})
}

// One implementation of the arithmetic: the owner's edit of the JSON job
// gives what kfoperator.RaiseReplicaMemory gives on the typed one.
func TestRaiseMemoryAgreesWithKfoperator(t *testing.T) {
	policy := kfoperator.OOMPolicy{Factor: 1.5, MaxIncrement: resource.MustParse("3Gi"), Max: resource.MustParse("20Gi")}
	oom := relaunch.OOM{Factor: 1.5, MaxIncrement: 3 * Gi, Max: 20 * Gi}
	for _, lr := range [][2]string{{"1Gi", "512Mi"}, {"1Gi", "1Gi"}, {"3Gi", ""}, {"", "2Gi"}, {"7Gi", "6Gi"}, {"19Gi", "10Gi"}, {"1500Mi", "1000Mi"}} {
		rs := corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}
		if lr[0] != "" {
			rs.Limits[corev1.ResourceMemory] = resource.MustParse(lr[0])
		}
		if lr[1] != "" {
			rs.Requests[corev1.ResourceMemory] = resource.MustParse(lr[1])
		}
		spec := &kubeflowv1.ReplicaSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "pytorch", Resources: rs}}}}}
		b, _ := json.Marshal(spec.Template.Spec)
		job := jobWith(t, string(b))
		wantLimit, wantErr := kfoperator.RaiseReplicaMemory(spec, "pytorch", policy)
		target, _, err := raiseMemory(job, "Worker", "pytorch", oom, 0)
		if (err != nil) != (wantErr != nil) || (err == nil && target != wantLimit.Value()) {
			t.Errorf("%v: owner %d, %v; kfoperator %s, %v", lr, target, err, wantLimit.String(), wantErr)
			continue
		}
		c := spec.Template.Spec.Containers[0].Resources
		l, r := resourcesOf(t, job)
		for _, cmp := range []struct {
			got  string
			want corev1.ResourceList
		}{{l, c.Limits}, {r, c.Requests}} {
			q, has := cmp.want[corev1.ResourceMemory]
			got, ok := quantity(cmp.got)
			if has != ok || (has && got.Cmp(q) != 0) {
				t.Errorf("%v: owner %s, kfoperator %v", lr, cmp.got, cmp.want)
			}
		}
	}
}

func TestAvoidHost(t *testing.T) {
	hostExpr := func(hosts ...string) map[string]any {
		v := []any{}
		for _, h := range hosts {
			v = append(v, h)
		}
		return map[string]any{"key": HostnameLabel, "operator": "NotIn", "values": v}
	}
	t.Run("no affinity yet", func(t *testing.T) {
		job := jobWith(t, container(`{}`))
		changed, err := avoidHost(job, "Worker", "node-a")
		if err != nil || !changed {
			t.Fatal(changed, err)
		}
		p := templatePod(t, job)
		if !p.avoids("node-a") || p.avoids("node-b") {
			t.Errorf("affinity %s", jsonOf(job))
		}
	})
	t.Run("hosts accumulate, once each", func(t *testing.T) {
		job := jobWith(t, container(`{}`))
		for _, h := range []string{"node-a", "node-b", "node-a", "node-b"} {
			if _, err := avoidHost(job, "Worker", h); err != nil {
				t.Fatal(err)
			}
		}
		changed, err := avoidHost(job, "Worker", "node-a")
		if err != nil || changed {
			t.Errorf("a host already avoided changed the job: %v %v", changed, err)
		}
		spec, _ := podSpec(job, "Worker")
		terms := spec["affinity"].(map[string]any)["nodeAffinity"].(map[string]any)["requiredDuringSchedulingIgnoredDuringExecution"].(map[string]any)["nodeSelectorTerms"].([]any)
		want := []any{map[string]any{"matchExpressions": []any{hostExpr("node-a", "node-b")}}}
		if !reflect.DeepEqual(terms, want) {
			t.Errorf("terms %s", jsonOf(terms))
		}
	})
	t.Run("every existing term, other rules kept", func(t *testing.T) {
		job := jobWith(t, `{"containers":[{"name":"pytorch"}],"affinity":{"podAntiAffinity":{"x":1},"nodeAffinity":{
			"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":1}],
			"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[
				{"matchExpressions":[{"key":"gpu","operator":"In","values":["a100"]}]},
				{"matchFields":[{"key":"metadata.name","operator":"In","values":["n1"]}]},
				{"matchExpressions":[{"key":"kubernetes.io/hostname","operator":"NotIn","values":["node-z"]}]}]}}}}`)
		if _, err := avoidHost(job, "Worker", "node-a"); err != nil {
			t.Fatal(err)
		}
		p := templatePod(t, job)
		if !p.avoids("node-a") || p.avoids("node-z") {
			t.Errorf("node-a in every term, node-z not: %s", jsonOf(job))
		}
		spec, _ := podSpec(job, "Worker")
		aff := spec["affinity"].(map[string]any)
		na := aff["nodeAffinity"].(map[string]any)
		terms := na["requiredDuringSchedulingIgnoredDuringExecution"].(map[string]any)["nodeSelectorTerms"].([]any)
		if aff["podAntiAffinity"] == nil || na["preferredDuringSchedulingIgnoredDuringExecution"] == nil || len(terms) != 3 ||
			terms[1].(map[string]any)["matchFields"] == nil ||
			!reflect.DeepEqual(terms[2].(map[string]any)["matchExpressions"], []any{hostExpr("node-z", "node-a")}) ||
			len(terms[0].(map[string]any)["matchExpressions"].([]any)) != 2 {
			t.Errorf("affinity %s", jsonOf(aff))
		}
	})
}

func TestCarriedRecord(t *testing.T) {
	job := jobWith(t, container(`{}`))
	if recs := carriedOf(job); len(recs) != 0 {
		t.Fatal(recs)
	}
	addCarried(job, carriedRecord{Seq: 5, Pod: "j-worker-1", Memory: 2 * Gi})
	addCarried(job, carriedRecord{Seq: 3, Pod: "j-worker-0", Host: "node-a"})
	if r, ok := findCarried(carriedOf(job), 5); !ok || r.Memory != 2*Gi || r.Pod != "j-worker-1" {
		t.Errorf("seq 5: %+v %v", r, ok)
	}
	if _, ok := findCarried(carriedOf(job), 4); ok {
		t.Error("seq 4 was never carried")
	}
	ann := job["metadata"].(map[string]any)["annotations"].(map[string]any)[CarriedAnnotation]
	if ann != `[{"seq":3,"pod":"j-worker-0","host":"node-a"},{"seq":5,"pod":"j-worker-1","memory":2147483648}]` {
		t.Errorf("annotation %v", ann)
	}
	for i := int64(10); i < 10+maxCarried+5; i++ {
		addCarried(job, carriedRecord{Seq: i, Pod: "j-worker-0"})
	}
	recs := carriedOf(job)
	if len(recs) != maxCarried || recs[len(recs)-1].Seq != 10+maxCarried+4 {
		t.Errorf("%d records, last %+v", len(recs), recs[len(recs)-1])
	}
	job["metadata"].(map[string]any)["annotations"].(map[string]any)[CarriedAnnotation] = "not json"
	if recs := carriedOf(job); recs != nil {
		t.Errorf("unreadable record: %v", recs)
	}
}

func TestPodSatisfiesExpectation(t *testing.T) {
	p := podJSON(t, `{"phase":"Running"}`, "")
	p.Spec.NodeName = "node-b"
	avoiding := podJSON(t, `{"phase":"Running"}`, "")
	avoiding.Spec.NodeName = "node-b"
	job := jobWith(t, container(`{}`))
	if _, err := avoidHost(job, "Worker", "node-a"); err != nil {
		t.Fatal(err)
	}
	avoiding.Spec.Affinity = templatePod(t, job).Spec.Affinity
	onBadHost := podJSON(t, `{"phase":"Running"}`, "")
	onBadHost.Spec.Affinity = avoiding.Spec.Affinity
	onBadHost.Spec.NodeName = "node-a"
	for _, tc := range []struct {
		p    *pod
		e    expectation
		want bool
	}{
		{p, expectation{memory: Gi}, true},
		{p, expectation{memory: 2 * Gi}, false},
		{p, expectation{hosts: []string{"node-a"}}, false}, // elsewhere, but nothing keeps it off node-a
		{avoiding, expectation{hosts: []string{"node-a"}}, true},
		{avoiding, expectation{hosts: []string{"node-a", "node-c"}}, false},
		{onBadHost, expectation{hosts: []string{"node-a"}}, false},
		{avoiding, expectation{memory: Gi, hosts: []string{"node-a"}}, true},
	} {
		if got := tc.e.satisfiedBy(tc.p, "pytorch"); got != tc.want {
			t.Errorf("%+v on %s: %v", tc.e, tc.p.Spec.NodeName, got)
		}
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
