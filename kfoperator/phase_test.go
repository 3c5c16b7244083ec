package kfoperator

import (
	"context"
	"math/rand"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/quick"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"gocloud.dev/blob/memblob"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// readSummary writes the failures as error documents into an in-memory
// bucket and reads them back with the plugin's reader (Summarize);
// readReport with the full list (Read).
func readSummary(t *testing.T, fs ...kferrors.Failure) *outputreader.Summary {
	return readWith(t, fs, outputreader.Summarize)
}

func readReport(t *testing.T, fs ...kferrors.Failure) *outputreader.Report {
	return readWith(t, fs, outputreader.Read)
}

func readWith[T any](t *testing.T, fs []kferrors.Failure, read func(context.Context, outputreader.Source, *outputreader.Options, ...kferrors.Failure) (T, error)) T {
	t.Helper()
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	w := kferrors.NewWriter(b, nil)
	for _, f := range fs {
		if _, err := w.Write(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	r, err := read(ctx, outputreader.NewBucketSource(b), &outputreader.Options{Now: func() time.Time { return at(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func job(kind string, cond kubeflowv1.JobConditionType, transition time.Time, failed int32) Job {
	two := int32(2)
	j := Job{
		Kind:     kind,
		Meta:     metav1.ObjectMeta{Name: "j", Namespace: "ns", CreationTimestamp: metav1.NewTime(at(-time.Hour))},
		Replicas: map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaSpec{"Master": {}, "Worker": {Replicas: &two}},
		Status: kubeflowv1.JobStatus{
			StartTime: &metav1.Time{Time: at(-time.Hour)},
			Conditions: []kubeflowv1.JobCondition{
				{Type: kubeflowv1.JobCreated, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(at(-time.Hour))},
				{Type: kubeflowv1.JobRunning, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(at(-50 * time.Minute))},
				{Type: cond, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(transition)},
			},
			ReplicaStatuses: map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaStatus{"Worker": {Failed: failed}},
		},
	}
	return j
}

func failedPod(name, reason string, exit int32, finished time.Time) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
			Name:  "pytorch",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: reason, ExitCode: exit, FinishedAt: metav1.NewTime(finished)}},
		}}},
	}
}

var cfg = PhaseConfig{LateDocumentGrace: 30 * time.Second, OperatorTimeout: time.Minute}

func TestPhaseNonTerminal(t *testing.T) {
	for cond, want := range map[kubeflowv1.JobConditionType]pluginsCore.Phase{
		kubeflowv1.JobCreated:    pluginsCore.PhaseQueued,
		kubeflowv1.JobSuspended:  pluginsCore.PhaseQueued,
		kubeflowv1.JobRunning:    pluginsCore.PhaseRunning,
		kubeflowv1.JobRestarting: pluginsCore.PhaseRunning,
	} {
		j := job(kubeflowv1.PyTorchJobKind, cond, at(0), 0)
		before := j.Status.Conditions[0]
		p, err := Phase(j, nil, nil, at(time.Second), cfg, pluginsCore.TaskInfo{})
		if err != nil || p.Phase() != want {
			t.Errorf("%s: %v %v, want %v", cond, p.Phase(), err, want)
		}
		if j.Status.Conditions[0] != before {
			t.Errorf("Phase reordered the job's conditions")
		}
	}
	// Never started by the operator, past the timeout: an error, as upstream.
	j := job(kubeflowv1.PyTorchJobKind, kubeflowv1.JobCreated, at(0), 0)
	j.Status = kubeflowv1.JobStatus{}
	if _, err := Phase(j, nil, nil, at(time.Second), cfg, pluginsCore.TaskInfo{}); err == nil || !strings.Contains(err.Error(), "has not updated") {
		t.Errorf("operator timeout: %v", err)
	}
	if p, err := Phase(j, nil, nil, at(-59*time.Minute-30*time.Second), cfg, pluginsCore.TaskInfo{}); err != nil || p.Phase() != pluginsCore.PhaseQueued {
		t.Errorf("fresh job: %v %v", p, err)
	}
}

func TestPhaseTerminal(t *testing.T) {
	userErr := kferrors.UserError("RuntimeError", "CUDA out of bounds", "j-worker-0", at(100*time.Millisecond))
	// The peer's secondary failure, a second later, must not win.
	peer := kferrors.UserError("DistBackendError", "Connection closed by peer", "j-worker-1", at(1100*time.Millisecond))
	oomAgent := kferrors.SystemFailure(kferrors.CodeOOMKilled, "killed", "j-worker-1/0", at(50*time.Millisecond))
	recoverable := kferrors.UserError(kferrors.CodeRecoverable, "try again", "j-worker-0", at(10*time.Millisecond))
	recoverable.Recoverable = true

	type tc struct {
		cond    kubeflowv1.JobConditionType
		docs    []kferrors.Failure
		pods    []corev1.Pod // nil: not listed
		failed  int32        // in the job status
		now     time.Duration
		phase   pluginsCore.Phase
		code    string
		kind    core.ExecutionError_ErrorKind
		worker  string
		ts      time.Time
		message []string
	}
	pods3 := []corev1.Pod{
		failedPod("j-worker-0", "Error", 1, at(200*time.Millisecond)),
		failedPod("j-worker-1", "Error", 1, at(1200*time.Millisecond)),
		failedPod("j-worker-2", "OOMKilled", 137, at(20*time.Millisecond)),
		{ObjectMeta: metav1.ObjectMeta{Name: "j-master-0"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
	}
	for name, c := range map[string]tc{
		"user error wins over the peer's secondary failure": {cond: kubeflowv1.JobFailed, docs: []kferrors.Failure{peer, userErr}, failed: 2, now: 0,
			phase: pluginsCore.PhasePermanentFailure, code: "RuntimeError", kind: core.ExecutionError_USER, worker: "j-worker-0", ts: userErr.Time,
			message: []string{"[j-worker-0, 2026-11-21T10:00:00.100000000Z] RuntimeError: CUDA out of bounds", "Also failed: 1 other worker (1× DistBackendError)"}},
		"recoverable system root cause is system-retryable": {cond: kubeflowv1.JobFailed, docs: []kferrors.Failure{userErr, oomAgent}, failed: 2,
			phase: pluginsCore.PhaseRetryableFailure, code: "OOMKilled", kind: core.ExecutionError_SYSTEM, worker: "j-worker-1/0", ts: oomAgent.Time},
		"recoverable user root cause is retryable": {cond: kubeflowv1.JobFailed, docs: []kferrors.Failure{recoverable, peer}, failed: 2,
			phase: pluginsCore.PhaseRetryableFailure, code: kferrors.CodeRecoverable, kind: core.ExecutionError_USER, worker: "j-worker-0", ts: recoverable.Time},
		"succeeded with a document (flytekit exits 0) is a failure": {cond: kubeflowv1.JobSucceeded, docs: []kferrors.Failure{userErr},
			phase: pluginsCore.PhasePermanentFailure, code: "RuntimeError", kind: core.ExecutionError_USER, worker: "j-worker-0", ts: userErr.Time},
		"succeeded without documents is a success": {cond: kubeflowv1.JobSucceeded, phase: pluginsCore.PhaseSuccess},
		"succeeded with a pod that failed on the way is a success": {cond: kubeflowv1.JobSucceeded, pods: pods3, failed: 1, now: time.Second,
			phase: pluginsCore.PhaseSuccess},
		"failed without documents or pods: upstream's retryable failure": {cond: kubeflowv1.JobFailed, failed: 1, now: time.Minute,
			phase: pluginsCore.PhaseRetryableFailure, code: "DownstreamSystemError", message: []string{"Job failed:", "BackoffLimitExceeded"}},
		"late documents: wait within the grace (status count)": {cond: kubeflowv1.JobFailed, docs: []kferrors.Failure{peer}, failed: 2, now: 10 * time.Second,
			phase: pluginsCore.PhaseRunning, message: []string{"waiting for error documents: 1 of 2 failed pods have reported"}},
		"late documents: wait within the grace (pods)": {cond: kubeflowv1.JobFailed, docs: []kferrors.Failure{peer, userErr}, pods: pods3, now: 29 * time.Second,
			phase: pluginsCore.PhaseRunning, message: []string{"waiting for error documents: 2 of 3 failed pods have reported"}},
		"after the grace, the OOMKilled pod's synthesized document is the root cause": {cond: kubeflowv1.JobFailed, docs: []kferrors.Failure{peer, userErr}, pods: pods3, now: 30 * time.Second,
			phase: pluginsCore.PhaseRetryableFailure, code: "OOMKilled", kind: core.ExecutionError_SYSTEM, worker: "j-worker-2", ts: at(20 * time.Millisecond),
			message: []string{"[j-worker-2, 2026-11-21T10:00:00.020000000Z] OOMKilled: pod j-worker-2", "Also failed: 2 other workers"}},
		"pods deleted after the job ended: the status count still waits": {cond: kubeflowv1.JobFailed, docs: []kferrors.Failure{peer}, pods: []corev1.Pod{}, failed: 2, now: time.Second,
			phase: pluginsCore.PhaseRunning, message: []string{"1 of 2 failed pods have reported"}},
		"two ranks of one pod are one pod": {cond: kubeflowv1.JobFailed, failed: 2, now: time.Second,
			docs:  []kferrors.Failure{oomAgent, kferrors.SystemFailure(kferrors.CodeOOMKilled, "killed", "j-worker-1/1", at(60*time.Millisecond))},
			phase: pluginsCore.PhaseRunning, message: []string{"1 of 2 failed pods have reported"}},
		"agent documents (<pod>/<rank>) count for their pod": {cond: kubeflowv1.JobFailed, docs: []kferrors.Failure{oomAgent, userErr},
			pods: pods3[:2], now: 0, phase: pluginsCore.PhaseRetryableFailure, code: "OOMKilled", worker: "j-worker-1/0", kind: core.ExecutionError_SYSTEM, ts: oomAgent.Time},
	} {
		t.Run(name, func(t *testing.T) {
			j := job(kubeflowv1.PyTorchJobKind, c.cond, at(0), c.failed)
			j.Status.Conditions[2].Reason, j.Status.Conditions[2].Message = "BackoffLimitExceeded", "PyTorchJob j has failed"
			var report *outputreader.Summary
			if len(c.docs) > 0 {
				report = readSummary(t, c.docs...)
			}
			p, err := Phase(j, c.pods, report, at(c.now), cfg, pluginsCore.TaskInfo{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Phase() != c.phase {
				t.Fatalf("phase %v (%v), want %v", p.Phase(), p, c.phase)
			}
			text := ""
			if e := p.Err(); e != nil {
				text = e.GetMessage()
				if e.GetCode() != c.code {
					t.Errorf("code %q, want %q", e.GetCode(), c.code)
				}
				if c.worker != "" && (e.GetKind() != c.kind || e.GetWorker() != c.worker || !e.GetTimestamp().AsTime().Equal(c.ts)) {
					t.Errorf("kind %v worker %q time %v, want %v %q %v", e.GetKind(), e.GetWorker(), e.GetTimestamp().AsTime(), c.kind, c.worker, c.ts)
				}
			}
			if p.Phase() == pluginsCore.PhaseRunning {
				for _, r := range p.Info().AdditionalReasons {
					text += r.Reason
				}
			}
			for _, m := range c.message {
				if !strings.Contains(text, m) {
					t.Errorf("message %q lacks %q", text, m)
				}
			}
			if p.Info() == nil || p.Info().OccurredAt == nil || !p.Info().OccurredAt.Equal(at(c.now)) {
				t.Errorf("OccurredAt is not the now passed in")
			}
		})
	}
}

// TestSynthesize: the plugin's side of kferrors.ClassifyPod; the whole
// table, run through the plugin and the master alike, is master/kube's
// TestPodConformance.
func TestSynthesize(t *testing.T) {
	fallback := at(time.Minute)
	for name, c := range map[string]struct {
		pod         corev1.Pod
		code        string
		recoverable bool
		origin      core.ExecutionError_ErrorKind
		at          time.Time
	}{
		"OOMKilled": {pod: failedPod("p", "OOMKilled", 137, at(time.Second)), code: kferrors.CodeOOMKilled, recoverable: true, origin: core.ExecutionError_SYSTEM, at: at(time.Second)},
		"SIGKILL":   {pod: failedPod("p", "Error", 137, at(time.Second)), code: "SignalSIGKILL", recoverable: true, origin: core.ExecutionError_SYSTEM, at: at(time.Second)},
		"SIGTERM":   {pod: failedPod("p", "Error", 143, at(time.Second)), code: kferrors.CodePreempted, recoverable: true, origin: core.ExecutionError_SYSTEM, at: at(time.Second)},
		"exit 1":    {pod: failedPod("p", "Error", 1, at(time.Second)), code: kferrors.CodeNonZeroExit, origin: core.ExecutionError_USER, at: at(time.Second)},
		"Evicted": {pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "disk pressure",
			Conditions: []corev1.PodCondition{{Type: corev1.DisruptionTarget, LastTransitionTime: metav1.NewTime(at(2 * time.Second))}}}},
			// The pod's own last transition, not the later job's (fallback).
			code: kferrors.CodeEvicted, recoverable: true, origin: core.ExecutionError_SYSTEM, at: at(2 * time.Second)},
		"DeadlineExceeded": {pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "DeadlineExceeded"}},
			code: kferrors.CodeDeadlineExceeded, recoverable: true, origin: core.ExecutionError_USER, at: fallback},
		"NodeLost": {pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.PodStatus{Phase: corev1.PodRunning, Reason: "NodeLost"}},
			code: kferrors.CodeNodeLost, recoverable: true, origin: core.ExecutionError_SYSTEM, at: fallback},
	} {
		f, ok := Synthesize(&c.pod, "pytorch", fallback)
		if !ok {
			t.Errorf("%s: not synthesized", name)
			continue
		}
		if f.Code != c.code || f.Recoverable != c.recoverable || f.Origin != c.origin || !f.Time.Equal(c.at) || f.Worker != "p" {
			t.Errorf("%s: %+v, want code %s recoverable %v origin %v at %v", name, f, c.code, c.recoverable, c.origin, c.at)
		}
	}
	running := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	if _, ok := Synthesize(&running, "pytorch", fallback); ok {
		t.Errorf("a running pod got a document")
	}
}

func TestLogPods(t *testing.T) {
	one, two, three := int32(1), int32(2), int32(3)
	j := Job{Meta: metav1.ObjectMeta{Name: "j"}, Replicas: map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaSpec{
		"Chief": {Replicas: &one}, "Worker": {Replicas: &two}, "PS": {Replicas: &three}, "Evaluator": {Replicas: &one},
	}}
	var names []string
	for _, p := range j.LogPods() {
		names = append(names, p.Name)
	}
	want := "j-chief-0 j-worker-0 j-worker-1 j-ps-0 j-ps-1 j-ps-2 j-evaluator-0"
	if strings.Join(names, " ") != want {
		t.Errorf("log pods %v, want %s", names, want)
	}
	j.Replicas = map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaSpec{"Master": {Replicas: &one}, "Worker": {Replicas: &one}}
	if ps := j.LogPods(); len(ps) != 2 || ps[0].Name != "j-master-0" || ps[1].Name != "j-worker-0" {
		t.Errorf("pytorch log pods %v", ps)
	}
}

// TestMergeIsTheMinimum checks Summary.Merge against a dumb reference:
// whatever the read documents and the synthesized failures, the root cause
// is the least of all of them by outputreader.Less, and every one counts.
func TestMergeIsTheMinimum(t *testing.T) {
	workers := []string{"j-worker-0", "j-worker-1", "j-worker-1/0", "j-master-0", ""}
	mk := func(r *rand.Rand) kferrors.Failure {
		f := kferrors.UserError("E", "m", workers[r.Intn(len(workers))], time.Time{})
		if r.Intn(5) > 0 {
			f.Time = at(time.Duration(r.Intn(4)) * 500 * time.Millisecond)
		}
		return f
	}
	check := func(seed int64) bool {
		r := rand.New(rand.NewSource(seed))
		var read, synth []kferrors.Failure
		for i := r.Intn(4); i > 0; i-- {
			read = append(read, mk(r))
		}
		for i := r.Intn(4); i > 0; i-- {
			f := mk(r)
			if f.Time.IsZero() {
				f.Time = at(time.Second) // Synthesize always dates
			}
			synth = append(synth, f)
		}
		report := &outputreader.Report{}
		if len(read) > 0 {
			report = readReport(t, read...)
		}
		merged := report.Summary().Merge(synth...)
		all := []outputreader.Document{}
		if report.RootCause != nil {
			all = append(all, *report.RootCause)
		}
		all = append(all, report.Others...)
		for _, f := range synth {
			all = append(all, outputreader.Document{Failure: f, Synthesized: true, At: f.Time})
		}
		if merged.Documents() != len(read)+len(synth) {
			t.Logf("seed %d: %d documents after merge, want %d", seed, merged.Documents(), len(read)+len(synth))
			return false
		}
		if len(all) == 0 {
			return merged.RootCause == nil
		}
		least := slices.MinFunc(all, func(a, b outputreader.Document) int {
			switch {
			case outputreader.Less(a, b):
				return -1
			case outputreader.Less(b, a):
				return 1
			}
			return 0
		})
		if least.Key != merged.RootCause.Key || least.Failure != merged.RootCause.Failure {
			t.Logf("seed %d: root %v, want %v", seed, merged.RootCause.Failure, least.Failure)
			return false
		}
		return true
	}
	if err := quick.Check(check, &quick.Config{MaxCount: 300}); err != nil {
		t.Error(err)
	}
}

// Issue 27, item 4: a job whose pods exited 0 (flytekit does after writing
// its document) and whose only document could not be read (over the
// reader's limit) is a failure, never a success: the document is a failure
// of the pod that wrote it, with what could be read of it.
func TestPhaseSucceededWithUnreadableDocumentFails(t *testing.T) {
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	big := kferrors.UserError("USER:RuntimeError", "Trace:\n\n    Traceback (most recent call last):\n"+strings.Repeat("x", 2<<20), "j-worker-0", at(0))
	doc := big.Document(4 << 20)
	data, err := kferrors.Encode(doc)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteAll(ctx, "error-0123456789abcdef0123456789abcdef.pb", data, nil); err != nil {
		t.Fatal(err)
	}
	s, err := outputreader.Summarize(ctx, outputreader.NewBucketSource(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Phase(job(kubeflowv1.PyTorchJobKind, kubeflowv1.JobSucceeded, at(0), 0), nil, s, at(time.Minute), cfg, pluginsCore.TaskInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Phase() != pluginsCore.PhaseRetryableFailure || p.Err() == nil || p.Err().GetCode() != UnreadableDocumentCode {
		t.Fatalf("phase %v, error %v: want a retryable failure %s (as upstream's ErrorFileBadFormat)", p.Phase(), p.Err(), UnreadableDocumentCode)
	}
	for _, want := range []string{"error-0123456789abcdef0123456789abcdef.pb", "(" + strconv.Itoa(len(data)) + " bytes)", "too large",
		`code "USER:RuntimeError"`, "Traceback (most recent call last):"} {
		if !strings.Contains(p.Err().GetMessage(), want) {
			t.Errorf("message lacks %q:\n%s", want, p.Err().GetMessage())
		}
	}
}

// A failed pod whose document (one of ours, naming the pod) is corrupt has
// reported: the mapping does not wait for it, and its failure, ranked by
// the document's write time, is the root cause when no readable one is
// earlier.
func TestPhaseFailedPodWithCorruptDocumentReported(t *testing.T) {
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	key := kferrors.NewKey(at(0), "j-worker-1/0", kferrors.RandomSuffix())
	if err := b.WriteAll(ctx, key, []byte("\x0a\x05\x0a\x03Val garbage"), nil); err != nil {
		t.Fatal(err)
	}
	s, err := outputreader.Summarize(ctx, outputreader.NewBucketSource(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !s.HasPod("j-worker-1") || s.Pods() != 1 {
		t.Fatalf("HasPod %v, Pods %d: the corrupt document names its pod", s.HasPod("j-worker-1"), s.Pods())
	}
	pods := []corev1.Pod{failedPod("j-worker-1", "Error", 1, at(time.Second))}
	p, err := Phase(job(kubeflowv1.PyTorchJobKind, kubeflowv1.JobFailed, at(time.Second), 1), pods, s, at(2*time.Second), cfg, pluginsCore.TaskInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Phase().IsFailure() || p.Err() == nil || p.Err().GetCode() != UnreadableDocumentCode || p.Err().GetWorker() != "j-worker-1.0" ||
		!strings.Contains(p.Err().GetMessage(), key) {
		t.Fatalf("phase %v, error %v: want the corrupt document's failure, without waiting", p.Phase(), p.Err())
	}
}

// vanishing lists its documents but finds none of them when read: an agent
// moved them aside (refined/, superseded/) between the two.
type vanishing struct{ outputreader.Source }

func (vanishing) Read(context.Context, string, int) ([]byte, error) {
	return nil, outputreader.ErrNotFound
}

// Documents that vanished while read are no failure of anyone, but a
// Succeeded job with nothing else is read again until the grace has
// passed, and then fails: a failed task never reads as a success.
func TestPhaseSucceededWithVanishedDocuments(t *testing.T) {
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	if _, err := kferrors.NewWriter(b, nil).Write(ctx, kferrors.UserError("ValueError", "ValueError: x", "j-worker-0", at(0))); err != nil {
		t.Fatal(err)
	}
	s, err := outputreader.Summarize(ctx, vanishing{outputreader.NewBucketSource(b)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.RootCause != nil || s.Skipped != 1 {
		t.Fatalf("root cause %v, %d skipped: a vanished document is no failure", s.RootCause, s.Skipped)
	}
	j := job(kubeflowv1.PyTorchJobKind, kubeflowv1.JobSucceeded, at(0), 0)
	p, err := Phase(j, nil, s, at(time.Second), cfg, pluginsCore.TaskInfo{})
	if err != nil || p.Phase() != pluginsCore.PhaseRunning {
		t.Fatalf("within the grace: phase %v %v, want Running (read again)", p.Phase(), err)
	}
	p, err = Phase(j, nil, s, at(time.Minute), cfg, pluginsCore.TaskInfo{})
	if err != nil || !p.Phase().IsFailure() || p.Err().GetCode() != UnreadableDocumentCode {
		t.Fatalf("after the grace: phase %v %v, want a failure %s", p.Phase(), err, UnreadableDocumentCode)
	}
}

// Issue 27, late uploads: the job turns Failed at the first pod the master
// stopped (exit 1) while the pod that raised first may still be refining
// and uploading its command's document; its unrefined one (torch's whole
// second) must not decide meanwhile. A pod that runs the agent and has not
// ended is waited for, within the grace.
func TestPhaseWaitsForPodsStillRunningTheAgent(t *testing.T) {
	s := readSummary(t, kferrors.SystemFailure(kferrors.CodeJobStopped, "stopped", "j-worker-1", at(2*time.Second)))
	agentPod := func(p corev1.Pod) corev1.Pod {
		p.Spec.InitContainers = []corev1.Container{{Name: initContainer}}
		return p
	}
	running := agentPod(corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "j-worker-0"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}})
	pods := []corev1.Pod{agentPod(failedPod("j-worker-1", "Error", 1, at(3*time.Second))), running}
	j := job(kubeflowv1.PyTorchJobKind, kubeflowv1.JobFailed, at(3*time.Second), 1)
	p, err := Phase(j, pods, s, at(4*time.Second), cfg, pluginsCore.TaskInfo{})
	if err != nil || p.Phase() != pluginsCore.PhaseRunning || len(p.Info().AdditionalReasons) == 0 ||
		!strings.Contains(p.Info().AdditionalReasons[0].Reason, "1 pods still running") {
		t.Fatalf("phase %v %v %+v: want Running while j-worker-0 may still upload", p.Phase(), err, p.Info())
	}
	// Without the agent (a plain PyTorchJob's pod) nothing is waited for.
	pods[1].Spec.InitContainers = nil
	if p, err := Phase(j, pods, s, at(4*time.Second), cfg, pluginsCore.TaskInfo{}); err != nil || !p.Phase().IsFailure() {
		t.Fatalf("phase %v %v: want a decision", p.Phase(), err)
	}
	// After the grace, the decision is made with what there is.
	pods[1].Spec.InitContainers = []corev1.Container{{Name: initContainer}}
	if p, err := Phase(j, pods, s, at(time.Minute), cfg, pluginsCore.TaskInfo{}); err != nil || !p.Phase().IsFailure() ||
		p.Err().GetCode() != kferrors.CodeJobStopped {
		t.Fatalf("phase %v %v: want the JobStopped failure after the grace", p.Phase(), err)
	}
}
