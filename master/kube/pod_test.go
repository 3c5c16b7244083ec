package kube

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kfelastic/kfelastic/kfoperator"
)

// podJSON is a worker pod of job "j" with the given status (JSON) and
// metadata additions, decoded through the owner's own structs.
func podJSON(t *testing.T, status string, meta string) *pod {
	t.Helper()
	if meta != "" {
		meta = "," + meta
	}
	s := fmt.Sprintf(`{"metadata":{"name":"j-worker-1","uid":"u1","creationTimestamp":"2026-01-02T03:00:00Z",
		"labels":{"training.kubeflow.org/job-name":"j","training.kubeflow.org/replica-type":"worker","training.kubeflow.org/replica-index":"1"}%s},
		"spec":{"nodeName":"node-a","containers":[{"name":"pytorch","resources":{"limits":{"memory":"1Gi"}}}]},
		"status":%s}`, meta, status)
	var p pod
	if err := json.Unmarshal([]byte(s), &p); err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	return &p
}

func terminatedStatus(phase string, code int, reason string) string {
	return fmt.Sprintf(`{"phase":%q,"containerStatuses":[{"name":"pytorch","state":{"terminated":{"exitCode":%d,"reason":%q,
		"finishedAt":"2026-01-02T03:04:05Z"}}}]}`, phase, code, reason)
}

// The pod → PodGone mapping, one row per way a worker pod dies without its
// agent saying so (and a few ways it does not die).
func TestClassifyPods(t *testing.T) {
	finished := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := time.Date(2026, 1, 2, 3, 10, 0, 0, time.UTC)
	running := `{"phase":"Running","containerStatuses":[{"name":"pytorch","state":{"running":{}}}]}`
	deleting := `"deletionTimestamp":"2026-01-02T03:05:30Z","deletionGracePeriodSeconds":30`
	for _, tc := range []struct {
		name        string
		status      string
		meta        string
		deleted     bool
		code        string // "" = not gone
		recoverable bool
		at          time.Time
		message     string
	}{
		{name: "running", status: running},
		{name: "succeeded", status: terminatedStatus("Succeeded", 0, "Completed")},
		{name: "pending without status", status: `{"phase":"Pending"}`},
		{name: "OOMKilled", status: terminatedStatus("Failed", 137, "OOMKilled"), code: "OOMKilled", recoverable: true, at: finished, message: "memory 1Gi"},
		{name: "SIGKILL without OOM", status: terminatedStatus("Failed", 137, "Error"), code: "SignalSIGKILL", recoverable: true, at: finished},
		{name: "SIGTERM is a preemption", status: terminatedStatus("Failed", 143, "Error"), code: "Preempted", recoverable: true, at: finished},
		{name: "SIGABRT", status: terminatedStatus("Failed", 134, "Error"), code: "SignalSIGABRT", recoverable: true, at: finished},
		{name: "SIGSEGV", status: terminatedStatus("Failed", 139, "Error"), code: "SignalSIGSEGV", recoverable: true, at: finished},
		{name: "signal field", status: `{"phase":"Failed","containerStatuses":[{"name":"pytorch","state":{"terminated":{"exitCode":0,"signal":9,"reason":"Error"}}}]}`,
			code: "SignalSIGKILL", recoverable: true, at: now},
		{name: "exit 1 is the user's", status: terminatedStatus("Failed", 1, "Error"), code: "NonZeroExit", at: finished},
		{name: "exit 2 is the user's", status: terminatedStatus("Failed", 2, "Error"), code: "NonZeroExit", at: finished},
		{name: "primary ended, pod not yet Failed", status: terminatedStatus("Running", 1, "Error"), code: "NonZeroExit", at: finished},
		{name: "init container failed", status: `{"phase":"Failed","initContainerStatuses":[{"name":"kfelastic-install","state":{"terminated":{"exitCode":1,"reason":"Error"}}}]}`,
			code: "NonZeroExit", at: now},
		{name: "evicted", status: `{"phase":"Failed","reason":"Evicted","message":"The node was low on resource: memory.",
			"conditions":[{"type":"Ready","status":"False","lastTransitionTime":"2026-01-02T03:04:00Z"}]}`,
			code: "Evicted", recoverable: true, at: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), message: "low on resource"},
		{name: "evicted wins over its SIGKILL", status: `{"phase":"Failed","reason":"Evicted","containerStatuses":[{"name":"pytorch","state":{"terminated":{"exitCode":137,"reason":"Error","finishedAt":"2026-01-02T03:04:05Z"}}}]}`,
			code: "Evicted", recoverable: true, at: finished},
		{name: "OOMKilled wins over eviction", status: `{"phase":"Failed","reason":"Evicted","containerStatuses":[{"name":"pytorch","state":{"terminated":{"exitCode":137,"reason":"OOMKilled","finishedAt":"2026-01-02T03:04:05Z"}}}]}`,
			code: "OOMKilled", recoverable: true, at: finished},
		{name: "node lost", status: `{"phase":"Running","reason":"NodeLost","message":"Node node-a which was running pod j-worker-1 is unresponsive"}`,
			code: "NodeLost", recoverable: true, at: now},
		{name: "phase Unknown", status: `{"phase":"Unknown"}`, code: "NodeLost", recoverable: true, at: now},
		{name: "taint manager deletes", status: `{"phase":"Running","conditions":[{"type":"DisruptionTarget","status":"True","reason":"DeletionByTaintManager","lastTransitionTime":"2026-01-02T03:05:00Z"}]}`,
			meta: deleting, code: "NodeLost", recoverable: true, at: time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)},
		{name: "scheduler preempts", status: `{"phase":"Running","conditions":[{"type":"DisruptionTarget","status":"True","reason":"PreemptionByScheduler","lastTransitionTime":"2026-01-02T03:05:00Z"}]}`,
			meta: deleting, code: "Preempted", recoverable: true, at: time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)},
		{name: "eviction API", status: `{"phase":"Running","conditions":[{"type":"DisruptionTarget","status":"True","reason":"EvictionByEvictionAPI"}]}`,
			meta: deleting, code: "Evicted", recoverable: true, at: now},
		{name: "deleted from outside while running", status: running, meta: deleting, deleted: true,
			code: "Preempted", recoverable: true, at: time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC), message: "deleted from outside while Running"},
		{name: "deleted by the owner (not reported)", status: running, meta: deleting},
		{name: "deleted before it ever ran (not reported: it held no rank)", status: `{"phase":"Pending"}`, meta: deleting, deleted: true},
		{name: "deleted after it succeeded", status: terminatedStatus("Succeeded", 0, "Completed"), meta: deleting, deleted: true},
		{name: "deleted after OOM keeps OOMKilled", status: terminatedStatus("Failed", 137, "OOMKilled"), meta: deleting, deleted: true,
			code: "OOMKilled", recoverable: true, at: finished},
		{name: "failed without a container exit", status: `{"phase":"Failed","reason":"UnexpectedAdmissionError"}`, code: "NodeLost", recoverable: true, at: now},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := podJSON(t, tc.status, tc.meta)
			g, ok := classify(p, "pytorch", tc.deleted, now)
			if tc.code == "" {
				if ok {
					t.Fatalf("reported %+v for a pod that is not gone", g)
				}
				return
			}
			if !ok {
				t.Fatalf("not reported, want %s", tc.code)
			}
			if g.Code != tc.code || g.Recoverable != tc.recoverable || !g.Time.Equal(tc.at) {
				t.Errorf("got %s recoverable=%v at %v, want %s recoverable=%v at %v", g.Code, g.Recoverable, g.Time, tc.code, tc.recoverable, tc.at)
			}
			if g.Pod != "j-worker-1" || g.UID != "u1" || g.Index != 1 || g.Node != "node-a" {
				t.Errorf("identity %+v", g)
			}
			if !strings.Contains(g.Message, "j-worker-1") || !strings.Contains(g.Message, tc.message) {
				t.Errorf("message %q, want the pod and %q", g.Message, tc.message)
			}
		})
	}
}

// The owner's codes agree with kfoperator.Synthesize, which the plugin uses
// for the same pods (it links client-go; the owner must not): every exit
// code of a signal or a user error, OOMKilled or not, and the pod reasons.
func TestClassifyAgreesWithSynthesize(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 10, 0, 0, time.UTC)
	var pods []corev1.Pod
	for code := int32(1); code < 128+65; code++ {
		for _, reason := range []string{"Error", "OOMKilled"} {
			pods = append(pods, corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
				Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason,
					FinishedAt: metav1.NewTime(now)}}}}}})
		}
	}
	for _, reason := range []string{"Evicted", "NodeLost", "DeadlineExceeded", "Shutdown"} {
		pods = append(pods, corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: reason}})
	}
	for _, kp := range pods {
		kp.Name, kp.UID = "j-worker-0", "u"
		want, wantOK := kfoperator.Synthesize(&kp, "pytorch", now)
		b, err := json.Marshal(kp)
		if err != nil {
			t.Fatal(err)
		}
		var p pod
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		got, ok := classify(&p, "pytorch", false, now)
		if ok != wantOK || got.Code != want.Code || got.Recoverable != want.Recoverable {
			t.Errorf("%s: got %s (recoverable %v, %v), Synthesize says %s (recoverable %v, %v)",
				b, got.Code, got.Recoverable, ok, want.Code, want.Recoverable, wantOK)
		}
	}
}
