package kube

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	corev1 "k8s.io/api/core/v1"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/kfoperator"
)

// podJSON is a worker pod of job "j" with the given status (JSON) and
// metadata additions, decoded through the owner's own structs.
func podJSON(t *testing.T, status string, meta string) *pod {
	t.Helper()
	var p pod
	if err := json.Unmarshal([]byte(podText(status, meta)), &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// podText is that pod as the API server sends it.
func podText(status string, meta string) string {
	if meta != "" {
		meta = "," + meta
	}
	return fmt.Sprintf(`{"metadata":{"name":"j-worker-1","uid":"u1","creationTimestamp":"2026-01-02T03:00:00Z",
		"labels":{"training.kubeflow.org/job-name":"j","training.kubeflow.org/replica-type":"worker","training.kubeflow.org/replica-index":"1"}%s},
		"spec":{"nodeName":"node-a","containers":[{"name":"pytorch","resources":{"limits":{"memory":"1Gi"}}}]},
		"status":%s}`, meta, status)
}

func terminatedStatus(phase string, code int, reason string) string {
	return fmt.Sprintf(`{"phase":%q,"containerStatuses":[{"name":"pytorch","state":{"terminated":{"exitCode":%d,"reason":%q,
		"finishedAt":"2026-01-02T03:04:05Z"}}}]}`, phase, code, reason)
}

// podAdapter is one side that reads a dead pod's status through
// kferrors.ClassifyPod: the plugin (kfoperator.Synthesize, a corev1.Pod)
// or the master (classify, the owner's own structs). deleted: deleted from
// outside, which only the master can tell. applies is false where the side
// cannot see the row.
type podAdapter func(t *testing.T, js string, deleted bool, now time.Time) (f kferrors.Failure, ok, applies bool)

var podAdapters = map[string]podAdapter{
	"plugin": func(t *testing.T, js string, deleted bool, now time.Time) (kferrors.Failure, bool, bool) {
		if deleted {
			return kferrors.Failure{}, false, false // the plugin does not know who deleted a pod
		}
		var p corev1.Pod
		if err := json.Unmarshal([]byte(js), &p); err != nil {
			t.Fatalf("%v\n%s", err, js)
		}
		f, ok := kfoperator.Synthesize(&p, "pytorch", now)
		if ok != kfoperator.PodFailed(&p) {
			t.Errorf("PodFailed says %v, Synthesize %v", !ok, ok)
		}
		return f, ok, true
	},
	"master": func(t *testing.T, js string, deleted bool, now time.Time) (kferrors.Failure, bool, bool) {
		var p pod
		if err := json.Unmarshal([]byte(js), &p); err != nil {
			t.Fatalf("%v\n%s", err, js)
		}
		g, ok := classify(&p, "pytorch", deleted, now)
		if ok && (g.Pod != "j-worker-1" || g.UID != "u1" || g.Index != 1 || g.Node != "node-a") {
			t.Errorf("identity %+v", g)
		}
		return g.Failure, ok, true
	},
}

// TestPodConformance is the one table "a dead pod's status → its failure":
// every row runs through every adapter (the plugin's and the master's), the
// way gocloud's drivertest runs one suite over every driver. Each drifted
// case of the two former copies is a row here; kferrors.ClassifyPod says
// which way each was decided.
func TestPodConformance(t *testing.T) {
	finished := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := time.Date(2026, 1, 2, 3, 10, 0, 0, time.UTC)
	running := `{"phase":"Running","containerStatuses":[{"name":"pytorch","state":{"running":{}}}]}`
	deleting := `"deletionTimestamp":"2026-01-02T03:05:30Z","deletionGracePeriodSeconds":30`
	const (
		sys  = core.ExecutionError_SYSTEM
		user = core.ExecutionError_USER
	)
	for _, tc := range []struct {
		name        string
		status      string
		meta        string
		deleted     bool
		code        string // "" = not failed
		recoverable bool
		origin      core.ExecutionError_ErrorKind
		at          time.Time
		message     string
	}{
		{name: "running", status: running},
		{name: "succeeded", status: terminatedStatus("Succeeded", 0, "Completed")},
		{name: "pending without status", status: `{"phase":"Pending"}`},
		{name: "sidecar ended well, primary running", status: `{"phase":"Running","containerStatuses":[{"name":"pytorch","state":{"running":{}}},{"name":"side","state":{"terminated":{"exitCode":0,"reason":"Completed"}}}]}`},
		{name: "OOMKilled", status: terminatedStatus("Failed", 137, "OOMKilled"), code: "OOMKilled", recoverable: true, origin: sys, at: finished, message: "memory 1Gi"},
		{name: "OOMKilled in the last state of a failed pod", status: `{"phase":"Failed","containerStatuses":[{"name":"pytorch","state":{"waiting":{}},"lastState":{"terminated":{"exitCode":137,"reason":"OOMKilled","finishedAt":"2026-01-02T03:04:05Z"}}}]}`,
			code: "OOMKilled", recoverable: true, origin: sys, at: finished},
		{name: "a restarted container's last state is no death", status: `{"phase":"Running","containerStatuses":[{"name":"pytorch","state":{"running":{}},"lastState":{"terminated":{"exitCode":1,"reason":"Error"}}}]}`},
		{name: "SIGKILL without OOM", status: terminatedStatus("Failed", 137, "Error"), code: "SignalSIGKILL", recoverable: true, origin: sys, at: finished},
		{name: "SIGTERM is a preemption", status: terminatedStatus("Failed", 143, "Error"), code: "Preempted", recoverable: true, origin: sys, at: finished},
		{name: "SIGABRT", status: terminatedStatus("Failed", 134, "Error"), code: "SignalSIGABRT", recoverable: true, origin: sys, at: finished},
		{name: "SIGSEGV", status: terminatedStatus("Failed", 139, "Error"), code: "SignalSIGSEGV", recoverable: true, origin: sys, at: finished, message: "signal 11 (SIGSEGV)"},
		{name: "128+64 is SIGRTMAX", status: terminatedStatus("Failed", 192, "Error"), code: "SignalSIG64", recoverable: true, origin: sys, at: finished},
		{name: "signal field", status: `{"phase":"Failed","containerStatuses":[{"name":"pytorch","state":{"terminated":{"exitCode":0,"signal":9,"reason":"Error"}}}]}`,
			code: "SignalSIGKILL", recoverable: true, origin: sys, at: now},
		{name: "agent exit 200 is NodeCheckFailed, not a signal", status: terminatedStatus("Failed", 200, "Error"), code: "NodeCheckFailed", recoverable: true, origin: sys, at: finished, message: "exit code 200"},
		{name: "agent exit 201 is Straggler", status: terminatedStatus("Failed", 201, "Error"), code: "Straggler", recoverable: true, origin: sys, at: finished},
		{name: "agent exit 202 is RendezvousTimeout", status: terminatedStatus("Failed", 202, "Error"), code: "RendezvousTimeout", recoverable: true, origin: sys, at: finished},
		{name: "agent exit 203 is Hang", status: terminatedStatus("Failed", 203, "Error"), code: "Hang", recoverable: true, origin: sys, at: finished},
		{name: "agent exit 204 is recoverable", status: terminatedStatus("Failed", 204, "Error"), code: "USER:Recoverable", recoverable: true, origin: user, at: finished},
		{name: "exit 1 is the user's", status: terminatedStatus("Failed", 1, "Error"), code: "NonZeroExit", origin: user, at: finished, message: "container pytorch: reason Error, exit code 1"},
		{name: "exit 2 is the user's", status: terminatedStatus("Failed", 2, "Error"), code: "NonZeroExit", origin: user, at: finished},
		{name: "exit 255 is the user's, not a signal", status: terminatedStatus("Failed", 255, "Error"), code: "NonZeroExit", origin: user, at: finished},
		{name: "primary ended, pod not yet Failed", status: terminatedStatus("Running", 1, "Error"), code: "NonZeroExit", origin: user, at: finished},
		{name: "init container failed", status: `{"phase":"Failed","initContainerStatuses":[{"name":"kfelastic-install","state":{"terminated":{"exitCode":1,"reason":"Error"}}}]}`,
			code: "NonZeroExit", origin: user, at: now, message: "container kfelastic-install"},
		{name: "evicted", status: `{"phase":"Failed","reason":"Evicted","message":"The node was low on resource: memory.",
			"conditions":[{"type":"Ready","status":"False","lastTransitionTime":"2026-01-02T03:04:00Z"}]}`,
			code: "Evicted", recoverable: true, origin: sys, at: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), message: "low on resource"},
		{name: "evicted wins over its SIGKILL", status: `{"phase":"Failed","reason":"Evicted","containerStatuses":[{"name":"pytorch","state":{"terminated":{"exitCode":137,"reason":"Error","finishedAt":"2026-01-02T03:04:05Z"}}}]}`,
			code: "Evicted", recoverable: true, origin: sys, at: finished},
		{name: "OOMKilled wins over eviction", status: `{"phase":"Failed","reason":"Evicted","containerStatuses":[{"name":"pytorch","state":{"terminated":{"exitCode":137,"reason":"OOMKilled","finishedAt":"2026-01-02T03:04:05Z"}}}]}`,
			code: "OOMKilled", recoverable: true, origin: sys, at: finished},
		{name: "DeadlineExceeded is the user's, retryable", status: `{"phase":"Failed","reason":"DeadlineExceeded","message":"Pod was active on the node longer than the specified deadline"}`,
			code: "DeadlineExceeded", recoverable: true, origin: user, at: now, message: "longer than the specified deadline"},
		{name: "node lost", status: `{"phase":"Running","reason":"NodeLost","message":"Node node-a which was running pod j-worker-1 is unresponsive"}`,
			code: "NodeLost", recoverable: true, origin: sys, at: now},
		{name: "graceful node shutdown", status: `{"phase":"Failed","reason":"Shutdown","message":"Pod Node is in progress of shutting down"}`,
			code: "NodeLost", recoverable: true, origin: sys, at: now},
		{name: "phase Unknown", status: `{"phase":"Unknown"}`, code: "NodeLost", recoverable: true, origin: sys, at: now},
		{name: "taint manager deletes", status: `{"phase":"Running","conditions":[{"type":"DisruptionTarget","status":"True","reason":"DeletionByTaintManager","lastTransitionTime":"2026-01-02T03:05:00Z"}]}`,
			meta: deleting, code: "NodeLost", recoverable: true, origin: sys, at: time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)},
		{name: "scheduler preempts", status: `{"phase":"Running","conditions":[{"type":"DisruptionTarget","status":"True","reason":"PreemptionByScheduler","lastTransitionTime":"2026-01-02T03:05:00Z"}]}`,
			meta: deleting, code: "Preempted", recoverable: true, origin: sys, at: time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)},
		{name: "scheduler preempts, its container SIGKILLed after the grace", status: `{"phase":"Failed","conditions":[{"type":"DisruptionTarget","status":"True","reason":"PreemptionByScheduler"}],
			"containerStatuses":[{"name":"pytorch","state":{"terminated":{"exitCode":137,"reason":"Error","finishedAt":"2026-01-02T03:04:05Z"}}}]}`,
			code: "Preempted", recoverable: true, origin: sys, at: finished},
		{name: "eviction API", status: `{"phase":"Running","conditions":[{"type":"DisruptionTarget","status":"True","reason":"EvictionByEvictionAPI"}]}`,
			meta: deleting, code: "Evicted", recoverable: true, origin: sys, at: now},
		{name: "deleted from outside while running", status: running, meta: deleting, deleted: true,
			code: "Preempted", recoverable: true, origin: sys, at: time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC), message: "deleted from outside while Running"},
		{name: "deleted by the owner (not reported)", status: running, meta: deleting},
		{name: "deleted before it ever ran (not reported: it held no rank)", status: `{"phase":"Pending"}`, meta: deleting, deleted: true},
		{name: "deleted after it succeeded", status: terminatedStatus("Succeeded", 0, "Completed"), meta: deleting, deleted: true},
		{name: "deleted after OOM keeps OOMKilled", status: terminatedStatus("Failed", 137, "OOMKilled"), meta: deleting, deleted: true,
			code: "OOMKilled", recoverable: true, origin: sys, at: finished},
		{name: "failed without a container exit", status: `{"phase":"Failed","reason":"UnexpectedAdmissionError"}`, code: "NodeLost", recoverable: true, origin: sys, at: now},
	} {
		for side, classify := range podAdapters {
			t.Run(side+"/"+tc.name, func(t *testing.T) {
				f, ok, applies := classify(t, podText(tc.status, tc.meta), tc.deleted, now)
				switch {
				case !applies:
					t.Skip("not visible to this side")
				case tc.code == "" && ok:
					t.Fatalf("reported %+v for a pod that has not failed", f)
				case tc.code == "":
					return
				case !ok:
					t.Fatalf("not reported, want %s", tc.code)
				}
				if f.Code != tc.code || f.Recoverable != tc.recoverable || f.Origin != tc.origin || !f.Time.Equal(tc.at) || f.Worker != "j-worker-1" {
					t.Errorf("got %s recoverable=%v origin=%v at %v worker %q, want %s recoverable=%v origin=%v at %v",
						f.Code, f.Recoverable, f.Origin, f.Time, f.Worker, tc.code, tc.recoverable, tc.origin, tc.at)
				}
				if !strings.Contains(f.Message, "j-worker-1") || !strings.Contains(f.Message, tc.message) {
					t.Errorf("message %q, want the pod and %q", f.Message, tc.message)
				}
			})
		}
	}
}

// Every exit code a container can end with, OOMKilled or not, reads the
// same on both sides, and as the exit-code contract reads it back.
func TestPodConformanceEveryExitCode(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 10, 0, 0, time.UTC)
	for code := 1; code < 256; code++ {
		for _, reason := range []string{"Error", "OOMKilled"} {
			js := podText(terminatedStatus("Failed", code, reason), "")
			want := kferrors.CodeOfExit(code)
			if reason == "OOMKilled" {
				want = kferrors.CodeOOMKilled
			}
			for side, classify := range podAdapters {
				f, ok, _ := classify(t, js, false, now)
				if !ok || f.Code != want || f.Recoverable != (want != kferrors.CodeNonZeroExit) {
					t.Errorf("%s: exit %d reason %s: got %s recoverable=%v (%v), want %s", side, code, reason, f.Code, f.Recoverable, ok, want)
				}
			}
		}
	}
}
