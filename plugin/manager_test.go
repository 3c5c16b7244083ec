package plugin

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/k8s"
	propellerk8s "github.com/flyteorg/flyte/flytepropeller/pkg/controller/nodes/task/k8s"
	"github.com/flyteorg/flyte/flytestdlib/promutils"
	"github.com/flyteorg/flyte/flytestdlib/storage"
	"github.com/go-logr/logr"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/flytetest"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/kfoperator"
	"github.com/kfelastic/kfelastic/outputreader"
)

func TestMain(m *testing.M) {
	// The informers' logs are not this test's business.
	ctrllog.SetLogger(logr.Discard())
	testenv.Main(m)
}

// setup is flytepropeller's SetupContext for a plugin manager. Propeller
// builds it from its controller; here it is assembled around a real
// controller-runtime client and cache on the envtest API server.
type setup struct {
	kube kubeClient
}

func (s setup) EnqueueOwner() pluginsCore.EnqueueOwner {
	return func(types.NamespacedName) error { return nil }
}
func (s setup) OwnerKind() string                                { return "ConfigMap" }
func (s setup) MetricsScope() promutils.Scope                    { return promutils.NewTestScope() }
func (s setup) KubeClient() pluginsCore.KubeClient               { return s.kube }
func (s setup) SecretManager() pluginsCore.SecretManager         { return nil }
func (s setup) ResourceRegistrar() pluginsCore.ResourceRegistrar { return nil }

type kubeClient struct {
	c  client.Client
	ca cache.Cache
}

func (k kubeClient) GetClient() client.Client { return k.c }
func (k kubeClient) GetCache() cache.Cache    { return k.ca }

// managerEnv is one namespace on the API server, a plugin manager around our
// pytorch plugin, and an owner object standing in for the FlyteWorkflow.
type managerEnv struct {
	c     client.Client
	mgr   *propellerk8s.PluginManager
	store *storage.DataStore
	cfg   *Config // the plugin's, read at each call
	ns    string
	owner metav1.OwnerReference
}

func newManagerEnv(t *testing.T, ns, taskType string) *managerEnv {
	t.Helper()
	cfg := kubeenv.Kube(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	flytetest.SetMetricKeys()
	c, err := client.New(cfg, client.Options{Scheme: kubeenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cache.New(cfg, cache.Options{Scheme: kubeenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "workflow", Namespace: ns}}
	if err := c.Create(ctx, owner); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(owner), owner); err != nil {
		t.Fatal(err)
	}
	pcfg := testConfig()
	pcfg.ListPods = true
	pcfg.LateDocumentGrace.Duration = 20 * time.Second
	var watch client.Object = &kubeflowv1.PyTorchJob{}
	if taskType == "tensorflow" {
		watch = &kubeflowv1.TFJob{}
	}
	mgr, err := propellerk8s.NewPluginManager(ctx, setup{kubeClient{c, ca}}, k8s.PluginEntry{
		ID:                  "kfelastic-" + taskType,
		RegisteredTaskTypes: []pluginsCore.TaskType{pluginsCore.TaskType(taskType)},
		ResourceToWatch:     watch,
		Plugin:              New(taskType, pcfg, c),
	}, propellerk8s.NewResourceMonitorIndex(), kubernetes.NewForConfigOrDie(cfg))
	if err != nil {
		t.Fatal(err)
	}
	store, err := flytetest.MemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	return &managerEnv{c: c, mgr: mgr, store: store, cfg: pcfg, ns: ns, owner: metav1.OwnerReference{
		APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: ptr(true),
	}}
}

func ptr[T any](v T) *T { return &v }

// launch runs the manager's first round: BuildResource and create.
func (e *managerEnv) launch(t *testing.T, name, template string) (*flytetest.Context, *kubeflowv1.PyTorchJob) {
	t.Helper()
	ctx := context.Background()
	tctx := flytetest.Task{Template: flytetest.LoadTemplate(t, template), Name: name, Namespace: e.ns, Owner: e.owner,
		Labels: map[string]string{"execution-id": name}, Prefix: storage.DataReference("s3://bucket/metadata/" + name), Store: e.store}.Context(ctx)
	tr, err := e.mgr.Handle(ctx, tctx)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Info().Phase() != pluginsCore.PhaseQueued {
		t.Fatalf("launch: %v", tr.Info())
	}
	job := &kubeflowv1.PyTorchJob{}
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: name}, job); err != nil {
		t.Fatalf("the job was not created: %v", err)
	}
	return tctx, job
}

// writeDocument puts an error document where the agent or flytekit would.
func (e *managerEnv) writeDocument(t *testing.T, tctx *flytetest.Context, f kferrors.Failure) {
	t.Helper()
	e.writeDocumentUnder(t, tctx, "", f)
}

// writeDocumentUnder writes f's document under dir ("superseded/") of the
// task's output prefix.
func (e *managerEnv) writeDocumentUnder(t *testing.T, tctx *flytetest.Context, dir string, f kferrors.Failure) {
	t.Helper()
	data, err := kferrors.Encode(f.Document(0))
	if err != nil {
		t.Fatal(err)
	}
	key := dir + kferrors.NewKey(f.Time, f.Worker, kferrors.RandomSuffix())
	ref, err := e.store.ConstructReference(context.Background(), tctx.OutputWriter().GetOutputPrefixPath(), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.WriteRaw(context.Background(), ref, int64(len(data)), storage.Options{}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
}

// setStatus moves the job to a terminal condition through the status
// subresource, as the training operator does.
func (e *managerEnv) setStatus(t *testing.T, job *kubeflowv1.PyTorchJob, cond kubeflowv1.JobConditionType, at time.Time, failed int32) {
	t.Helper()
	ctx := context.Background()
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
		t.Fatal(err)
	}
	start := metav1.NewTime(at.Add(-time.Minute))
	job.Status = kubeflowv1.JobStatus{
		StartTime: &start,
		Conditions: []kubeflowv1.JobCondition{
			{Type: kubeflowv1.JobCreated, Status: corev1.ConditionTrue, LastTransitionTime: start, LastUpdateTime: start},
			{Type: kubeflowv1.JobRunning, Status: corev1.ConditionFalse, LastTransitionTime: start, LastUpdateTime: start},
			{Type: cond, Status: corev1.ConditionTrue, Reason: "PyTorchJob" + string(cond), Message: "PyTorchJob " + job.Name + " is " + string(cond),
				LastTransitionTime: metav1.NewTime(at), LastUpdateTime: metav1.NewTime(at)},
		},
		ReplicaStatuses: map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaStatus{"Worker": {Failed: failed}},
	}
	if err := e.c.Status().Update(ctx, job); err != nil {
		t.Fatalf("status update: %v", err)
	}
}

// failPod creates a pod of the job and marks it failed, as the kubelet would.
func (e *managerEnv) failPod(t *testing.T, job *kubeflowv1.PyTorchJob, name, reason string, exit int32, finished time.Time) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Labels: map[string]string{kubeflowv1.JobNameLabel: job.Name}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "pytorch", Image: "trainer"}}, RestartPolicy: corev1.RestartPolicyNever},
	}
	if err := e.c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "pytorch", Image: "trainer", ImageID: "trainer@sha256:0",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: reason, ExitCode: exit,
			StartedAt: metav1.NewTime(finished.Add(-time.Minute)), FinishedAt: metav1.NewTime(finished)}},
	}}}
	if err := e.c.Status().Update(ctx, pod); err != nil {
		t.Fatalf("pod status: %v", err)
	}
}

func (e *managerEnv) handle(t *testing.T, tctx *flytetest.Context) pluginsCore.PhaseInfo {
	t.Helper()
	tr, err := e.mgr.Handle(context.Background(), tctx)
	if err != nil {
		t.Fatal(err)
	}
	return tr.Info()
}

func checkErr(t *testing.T, p pluginsCore.PhaseInfo, phase pluginsCore.Phase, code string, kind core.ExecutionError_ErrorKind, worker string, ts time.Time, msg ...string) {
	t.Helper()
	if p.Phase() != phase {
		t.Fatalf("phase %v, want %v (%v)", p.Phase(), phase, p)
	}
	e := p.Err()
	if e == nil {
		t.Fatalf("no ExecutionError")
	}
	if e.GetCode() != code || e.GetKind() != kind || e.GetWorker() != worker || !e.GetTimestamp().AsTime().Equal(ts) {
		t.Errorf("error code %q kind %v worker %q time %v; want %q %v %q %v", e.GetCode(), e.GetKind(), e.GetWorker(), e.GetTimestamp().AsTime(), code, kind, worker, ts)
	}
	for _, m := range msg {
		if !strings.Contains(e.GetMessage(), m) {
			t.Errorf("message %q lacks %q", e.GetMessage(), m)
		}
	}
}

// TestPluginManager drives our plugin with flytepropeller's own k8s plugin
// manager against a real API server: the job is created, its status moved
// to Failed or Succeeded by hand (no training operator here), error
// documents written to the DataStore, and the phase and root-cause
// ExecutionError checked, with retry kind following recoverability.
func TestPluginManager(t *testing.T) {
	e := newManagerEnv(t, "flyte-manager", "pytorch")
	past := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)

	t.Run("failed: the first error wins over the peer's, permanent", func(t *testing.T) {
		tctx, job := e.launch(t, "job-user-error", "upstream-pytorch-v1-only-worker")
		if p := e.handle(t, tctx); p.Phase() != pluginsCore.PhaseQueued {
			t.Fatalf("before the operator: %v", p)
		}
		root := kferrors.UserError("RuntimeError", "index out of range", "job-user-error-worker-3", past.Add(120*time.Millisecond))
		e.writeDocument(t, tctx, kferrors.UserError("DistBackendError", "Connection closed by peer", "job-user-error-worker-0", past.Add(1120*time.Millisecond)))
		e.writeDocument(t, tctx, root)
		e.setStatus(t, job, kubeflowv1.JobFailed, past.Add(2*time.Second), 2)
		p := e.handle(t, tctx)
		checkErr(t, p, pluginsCore.PhasePermanentFailure, "RuntimeError", core.ExecutionError_USER, root.Worker, root.Time,
			"[job-user-error-worker-3, "+root.Time.Format(outputreader.TimeLayout)+"] RuntimeError: index out of range", "1× DistBackendError")
		if len(p.Info().Logs) != 0 {
			// No log plugin is configured in tests; links are covered by
			// kfoperator's LogPods.
			t.Logf("logs: %v", p.Info().Logs)
		}
	})

	t.Run("succeeded with a recoverable document: retryable", func(t *testing.T) {
		tctx, job := e.launch(t, "job-flytekit-exit0", "upstream-pytorch-v1")
		f := kferrors.UserError(kferrors.CodeRecoverable, "FlyteRecoverableException: try again", "job-flytekit-exit0-worker-1", past)
		f.Recoverable = true
		e.writeDocument(t, tctx, f)
		e.setStatus(t, job, kubeflowv1.JobSucceeded, past.Add(time.Second), 0)
		checkErr(t, e.handle(t, tctx), pluginsCore.PhaseRetryableFailure, kferrors.CodeRecoverable, core.ExecutionError_USER, f.Worker, f.Time)
	})

	t.Run("failed: an OOMKilled pod without a document is the root cause, system-retryable", func(t *testing.T) {
		tctx, job := e.launch(t, "job-oom", "upstream-pytorch-v1")
		e.writeDocument(t, tctx, kferrors.UserError("DistBackendError", "Connection closed by peer", "job-oom-worker-0", past.Add(time.Second)))
		e.failPod(t, job, "job-oom-worker-0", "Error", 1, past.Add(1100*time.Millisecond))
		e.failPod(t, job, "job-oom-worker-1", "OOMKilled", 137, past.Add(300*time.Millisecond))
		e.setStatus(t, job, kubeflowv1.JobFailed, past.Add(2*time.Second), 2)
		checkErr(t, e.handle(t, tctx), pluginsCore.PhaseRetryableFailure, kferrors.CodeOOMKilled, core.ExecutionError_SYSTEM,
			// Pod statuses carry whole seconds (metav1.Time).
			"job-oom-worker-1", past.Add(300*time.Millisecond).Truncate(time.Second), "OOMKilled: pod job-oom-worker-1")
	})

	t.Run("late document: waits within the grace, then decides", func(t *testing.T) {
		tctx, job := e.launch(t, "job-late", "upstream-pytorch-v1")
		now := time.Now().UTC().Truncate(time.Millisecond)
		e.writeDocument(t, tctx, kferrors.UserError("DistBackendError", "Connection closed by peer", "job-late-worker-0", now.Add(-time.Second)))
		e.failPod(t, job, "job-late-worker-0", "Error", 1, now.Add(-900*time.Millisecond))
		e.failPod(t, job, "job-late-worker-1", "Error", 1, now.Add(-1500*time.Millisecond))
		e.setStatus(t, job, kubeflowv1.JobFailed, now, 2)
		p := e.handle(t, tctx)
		if p.Phase() != pluginsCore.PhaseRunning || len(p.Info().AdditionalReasons) == 0 ||
			!strings.Contains(p.Info().AdditionalReasons[0].Reason, "1 of 2 failed pods have reported") {
			t.Fatalf("within the grace: %v %+v", p, p.Info())
		}
		// The earliest error arrives late.
		late := kferrors.UserError("ValueError", "bad batch", "job-late-worker-1", now.Add(-1600*time.Millisecond))
		e.writeDocument(t, tctx, late)
		checkErr(t, e.handle(t, tctx), pluginsCore.PhasePermanentFailure, "ValueError", core.ExecutionError_USER, late.Worker, late.Time)
	})

	t.Run("succeeded without documents: success, outputs handed over", func(t *testing.T) {
		tctx, job := e.launch(t, "job-ok", "upstream-pytorch-v1")
		out := &core.LiteralMap{Literals: map[string]*core.Literal{"x": {Value: &core.Literal_Scalar{Scalar: &core.Scalar{Value: &core.Scalar_Primitive{Primitive: &core.Primitive{Value: &core.Primitive_Integer{Integer: 7}}}}}}}}
		if err := e.store.WriteProtobuf(context.Background(), tctx.OutputWriter().GetOutputPath(), storage.Options{}, out); err != nil {
			t.Fatal(err)
		}
		e.setStatus(t, job, kubeflowv1.JobSucceeded, past, 0)
		if p := e.handle(t, tctx); p.Phase() != pluginsCore.PhaseSuccess || p.Err() != nil {
			t.Fatalf("%v", p)
		}
	})

	t.Run("succeeded after recovering: success, with what it recovered from", func(t *testing.T) {
		tctx, job := e.launch(t, "job-healed", "upstream-pytorch-v1")
		// Worker 1's ranks timed out in NCCL; its node's GPU had fallen off
		// the bus: the job went on without it, and its documents were
		// moved aside.
		nccl := kferrors.SystemFailure(kferrors.CodeNcclTimeout, "Watchdog caught collective operation timeout", "job-healed-worker-1/0", past)
		g := kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 79, Severity: kferrors.SeverityCritical, GPUIndex: 0, Node: "node-a"}
		hw, _ := g.Failure("job-healed-worker-1", past.Add(time.Second), "")
		e.writeDocumentUnder(t, tctx, kferrors.SupersededPrefix, nccl)
		e.writeDocumentUnder(t, tctx, kferrors.SupersededPrefix, hw)
		e.setStatus(t, job, kubeflowv1.JobSucceeded, past.Add(time.Minute), 0)
		p := e.handle(t, tctx)
		if p.Phase() != pluginsCore.PhaseSuccess || p.Err() != nil {
			t.Fatalf("%v", p)
		}
		var reasons []string
		for _, r := range p.Info().AdditionalReasons {
			reasons = append(reasons, r.Reason)
		}
		want := "recovered from 2 failures of 1 pod (superseded/): the first:\n[job-healed-worker-1, "
		if len(reasons) != 1 || !strings.HasPrefix(reasons[0], want) || !strings.Contains(reasons[0], "GpuFallenOffBus") ||
			!strings.Contains(reasons[0], "node node-a") || !strings.Contains(reasons[0], "explains the earlier NcclTimeout") {
			t.Errorf("reasons %q, want %q… naming the GPU fault", reasons, want)
		}
	})

	t.Run("elastic: master objects created with the job", func(t *testing.T) {
		_, job := e.launch(t, "job-elastic", "pytorch-v1-elastic-3-4")
		if !kfoperator.IsElastic(job) || job.Spec.PyTorchReplicaSpecs["Master"].Template.Spec.ServiceAccountName != kfoperator.MasterAccountName(job.Name) {
			t.Fatalf("stored job is not elastic: %+v", job.Spec)
		}
		ctx := context.Background()
		var secret corev1.Secret
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: kfoperator.TokenSecretName(job.Name)}, &secret); err != nil || len(secret.Data[kfoperator.TokenKey]) != 64 {
			t.Errorf("token secret: %v %d bytes", err, len(secret.Data[kfoperator.TokenKey]))
		}
		if len(secret.OwnerReferences) != 1 || secret.OwnerReferences[0].UID != e.owner.UID {
			t.Errorf("secret owner %v", secret.OwnerReferences)
		}
		var role rbacv1.Role
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: kfoperator.MasterAccountName(job.Name)}, &role); err != nil || len(role.Rules) != 3 {
			t.Errorf("role: %v %+v", err, role.Rules)
		}
		for _, o := range []client.Object{&corev1.ServiceAccount{}, &rbacv1.RoleBinding{}} {
			if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: kfoperator.MasterAccountName(job.Name)}, o); err != nil {
				t.Errorf("%T: %v", o, err)
			}
		}
	})
}

// TestPluginManagerTFJob: a TFJob whose chief was OOM-killed without a
// document fails with a system-retryable OOMKilled on the chief, though a
// worker reported a (secondary) error later.
func TestPluginManagerTFJob(t *testing.T) {
	e := newManagerEnv(t, "flyte-manager-tf", "tensorflow")
	ctx := context.Background()
	past := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	tctx := flytetest.Task{Template: flytetest.LoadTemplate(t, "tensorflow-v1-ps"), Name: "tf-oom", Namespace: e.ns, Owner: e.owner,
		Prefix: "s3://bucket/metadata/tf-oom", Store: e.store}.Context(ctx)
	if p := e.handle(t, tctx); p.Phase() != pluginsCore.PhaseQueued {
		t.Fatalf("launch: %v", p)
	}
	job := &kubeflowv1.TFJob{}
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "tf-oom"}, job); err != nil {
		t.Fatal(err)
	}
	for name, rs := range map[string]int32{"Chief": 1, "Worker": 2, "PS": 1} {
		if got := *job.Spec.TFReplicaSpecs[kubeflowv1.ReplicaType(name)].Replicas; got != rs {
			t.Errorf("%s replicas %d, want %d", name, got, rs)
		}
	}
	e.writeDocument(t, tctx, kferrors.UserError("UnavailableError", "chief unreachable", "tf-oom-worker-1", past.Add(2*time.Second)))
	chief := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tf-oom-chief-0", Namespace: e.ns, Labels: map[string]string{kubeflowv1.JobNameLabel: "tf-oom"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "tensorflow", Image: "trainer"}}, RestartPolicy: corev1.RestartPolicyNever},
	}
	if err := e.c.Create(ctx, chief); err != nil {
		t.Fatal(err)
	}
	chief.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: "tensorflow", Image: "trainer", ImageID: "trainer@sha256:0",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137, FinishedAt: metav1.NewTime(past)}}}}}
	if err := e.c.Status().Update(ctx, chief); err != nil {
		t.Fatal(err)
	}
	at := metav1.NewTime(past.Add(3 * time.Second))
	job.Status = kubeflowv1.JobStatus{StartTime: &at, Conditions: []kubeflowv1.JobCondition{
		{Type: kubeflowv1.JobFailed, Status: corev1.ConditionTrue, Reason: "TFJobFailed", LastTransitionTime: at, LastUpdateTime: at},
	}}
	if err := e.c.Status().Update(ctx, job); err != nil {
		t.Fatal(err)
	}
	checkErr(t, e.handle(t, tctx), pluginsCore.PhaseRetryableFailure, kferrors.CodeOOMKilled, core.ExecutionError_SYSTEM, "tf-oom-chief-0", past,
		"container tensorflow: reason OOMKilled", "1× UnavailableError")
}
