package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/s3blob"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/outputreader"
)

// spareTaint keeps every pod but E10's off its spare node: the scenarios
// beside it share the cluster.
const spareTaint = "kfelastic.e2e/spare"

// E10 (issue 31): worker 1's GPU falls off the bus. Its ranks fail with
// NCCL's watchdog timeout (the stand-in raises torch's own error text),
// and the node's GPU daemon records an Xid 79 Warning event against the
// pod. The master takes the pod out with a GpuFallenOffBus document naming
// the node, and relaunches it with a node anti-affinity, not counted: the
// replacement lands on a spare node (simulated: it never trains), and the job
// goes on with workers 0 and 2 (Elastic(nnodes="2:3")) to its last step.
// The workflow succeeds on its first attempt (no Flyte retry), and its
// success event says what it recovered from: the GPU fault on that pod and
// node, which explains the earlier NCCL timeout.
func TestE10GPUFallenOffTheBus(t *testing.T) {
	e := scenario(t, "e10")
	tmpl := e.template("elastic-2-3", func(tmpl *core.TaskTemplate) {
		tmpl.GetCustom().GetFields()["workerReplicas"].GetStructValue().GetFields()["replicas"] = structpb.NewNumberValue(3)
		spec := tmpl.GetK8SPod().GetPodSpec().GetFields()
		c := spec["containers"].GetListValue().GetValues()[0].GetStructValue().GetFields()
		setStrings(c, "args", "--steps", "80", "--sleep", "0.1", "--ckpt-dir", "/ckpt", "--ckpt-every", "5",
			"--nccl-timeout-at", "15:-worker-1")
		// Three workers in the room of the others' two (sideBySide).
		res, _ := structpb.NewStruct(map[string]any{"requests": map[string]any{"cpu": "200m", "memory": "1Gi"},
			"limits": map[string]any{"cpu": "1", "memory": "3Gi"}})
		c["resources"] = structpb.NewStructValue(res)
		tol, _ := structpb.NewList([]any{map[string]any{"key": spareTaint, "operator": "Exists", "effect": "NoSchedule"}})
		spec["tolerations"] = structpb.NewListValue(tol)
	})
	j := e.launchWorkflow("e10", tmpl)
	w0, w1 := j.name+"-worker-0", j.name+"-worker-1"
	j.waitStep(w0, 5, 5*time.Minute)
	victim := j.pod(w1)
	bad := victim.Spec.NodeName
	// The spare node comes once every pod runs on the real one.
	spare := "sim-spare-" + j.name
	kubeenv.StartSimNodes(t, e.cluster.Config)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: spare,
		Annotations: map[string]string{kubeenv.SimNodeAnnotation: "true"},
		Labels:      map[string]string{"type": kubeenv.SimNodeLabel, "kubernetes.io/hostname": spare}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: spareTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}}}
	if err := e.kube.Create(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.kube.Delete(context.Background(), node) })

	failed := j.waitLog(w1, "Watchdog caught collective operation timeout", 3*time.Minute)
	// The daemon reports the Xid a moment after the workers' timeout (its
	// poll): the earliest failure is then a secondary one, which the
	// fault explains (outputreader.HardwareWindow). Event times are whole
	// seconds; the master caps one ahead of its clock at its reading.
	xidAt := failed.Add(time.Second).Truncate(time.Second)
	var r [4]byte
	_, _ = rand.Read(r[:])
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: w1 + "." + hex.EncodeToString(r[:]), Namespace: e.ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: e.ns, Name: w1, UID: victim.UID, APIVersion: "v1"},
		Reason:         kferrors.EventReasonXid, Type: corev1.EventTypeWarning, Count: 1,
		Message:        "[gpu-health] [CRITICAL] Xid 79 (GPU has fallen off the bus) on GPU 1 GPU-5e1f. xid=79 severity=critical gpu_uuid=GPU-5e1f gpu_index=1 pci=0000:3b:00.0",
		FirstTimestamp: metav1.NewTime(xidAt), LastTimestamp: metav1.NewTime(xidAt),
		Source: corev1.EventSource{Component: "gpu-health", Host: bad},
	}
	if err := e.kube.Create(t.Context(), ev); err != nil {
		t.Fatal(err)
	}

	// The replacement: the same name, on the spare node, kept off the bad one.
	limit, why := e.limit(3 * time.Minute)
	var repl *corev1.Pod
	for deadline := time.Now().Add(limit); ; time.Sleep(200 * time.Millisecond) {
		if p := j.podOrNil(w1); p != nil && p.UID != victim.UID && p.Spec.NodeName != "" {
			repl = p
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not relaunched within %v%s; pods: %s", w1, limit, why, j.podStates())
		}
	}
	if repl.Spec.NodeName != spare || kubeenv.HostnameAllowed(repl, bad) {
		t.Errorf("the replacement is on %q with affinity %+v; want on %s, kept off %s", repl.Spec.NodeName, repl.Spec.Affinity, spare, bad)
	}
	j.succeeds(6 * time.Minute)
	if log := j.logs(w0); !strings.Contains(log, "step = 79") {
		t.Errorf("worker 0 did not train to the end:\n%s", tail(log, 2000))
	}
	if o := j.outcomeNow(); o.Attempts > 1 {
		t.Errorf("the hardware fault spent a Flyte retry: %v", o)
	}
	master := e.cluster.PodLogs(e.ns, j.name+"-master-0", "")
	decision := regexp.MustCompile(`kind=relaunch-avoid-host rank=\d+ pod=` + regexp.QuoteMeta(w1) + ` host=` + regexp.QuoteMeta(bad) +
		` reason=GpuFallenOffBus counted=false`)
	if !decision.MatchString(master) {
		t.Errorf("no uncounted avoid-host relaunch of %s in the master's log:\n%s", w1, tail(master, 4000))
	}

	// What the job recovered from: worker 1's documents, moved aside.
	rep := e.superseded(t)
	if rep.RootCause == nil || rep.RootCause.Failure.Code != kferrors.CodeGpuFallenOffBus || rep.RootCause.Failure.Worker != w1 ||
		!strings.Contains(rep.RootCause.Failure.Message, "on node "+bad) || rep.RootCause.Failure.Origin != core.ExecutionError_SYSTEM || !rep.RootCause.Failure.Recoverable {
		t.Errorf("the recovered root cause: %+v; want worker 1's GpuFallenOffBus on node %s, SYSTEM, recoverable", rep.RootCause, bad)
	}
	if rep.Displaced == nil || rep.Displaced.Failure.Code != kferrors.CodeNcclTimeout || !strings.HasPrefix(rep.Displaced.Failure.Worker, w1+"/") {
		t.Errorf("the displaced failure: %+v; want a worker of %s's NcclTimeout", rep.Displaced, w1)
	}
	t.Logf("E10: what the UI would show:\n%s", rep.Message())
	// The success event's reason (the events file propeller writes here
	// has no reasons: the plugin's log says it too, and plugin's
	// TestPluginManager checks the event).
	logs := e.prop.Logs()
	if !strings.Contains(logs, "the job succeeded after recovering from failures") || !strings.Contains(logs, "GpuFallenOffBus") {
		t.Errorf("the plugin did not say what the task recovered from:\n%s", tail(logs, 4000))
	}
	t.Logf("E10: the success event's reason: %s", recoveredLine(logs))
}

// waitLog waits until the pod's log holds text and returns when it did.
func (j *job) waitLog(pod, text string, limit time.Duration) time.Time {
	j.e.t.Helper()
	limit, why := j.e.limit(limit)
	for deadline := time.Now().Add(limit); ; time.Sleep(200 * time.Millisecond) {
		if strings.Contains(j.logs(pod), text) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			j.e.t.Fatalf("pod %s: no %q within %v%s; log:\n%s", pod, text, limit, why, tail(j.logs(pod), 3000))
		}
	}
}

// superseded reads the documents under the task's superseded/ (the
// scenario's bucket holds one task).
func (e *env) superseded(t *testing.T) *outputreader.Report {
	t.Helper()
	ctx := t.Context()
	b, err := blob.OpenBucket(ctx, e.minio.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dir := ""
	it := b.List(nil)
	for {
		o, err := it.Next(ctx)
		if err != nil {
			break
		}
		if i := strings.Index(o.Key, kferrors.SupersededPrefix+kferrors.KeyPrefix); i >= 0 {
			dir = o.Key[:i+len(kferrors.SupersededPrefix)]
			break
		}
	}
	if dir == "" {
		t.Fatal("no document under superseded/ in the bucket")
	}
	rep, err := outputreader.Read(ctx, outputreader.NewBucketSource(blob.PrefixedBucket(b, dir)), nil)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// recoveredLine is the first line of the logged "recovered from" reason.
func recoveredLine(logs string) string {
	i := strings.Index(logs, "recovered from")
	if i < 0 {
		return ""
	}
	// The reason and the UI message's first line, as the log quotes them.
	text, _, _ := strings.Cut(logs[i:], "\n")
	first, rest, _ := strings.Cut(text, "\\n")
	second, _, _ := strings.Cut(rest, "\\n")
	return first + " " + second
}
