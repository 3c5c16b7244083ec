package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	"github.com/flyteorg/flyte/flytepropeller/pkg/apis/flyteworkflow/v1alpha1"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/flytetest"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/kfoperator"
)

// TestPropellerConfigValidates: propeller's own config loader accepts the
// configuration StartPropeller writes, strictly (every section known), for
// our plugins and for upstream's.
func TestPropellerConfigValidates(t *testing.T) {
	bin := kubeenv.BuildPropeller(t)
	store := &testenv.MinIOServer{MinIOProcess: &testenv.MinIOProcess{Endpoint: "http://127.0.0.1:9"}, Bucket: "b",
		AccessKey: testenv.MinIOAccessKey, SecretKey: testenv.MinIOSecretKey, Region: testenv.MinIORegion}
	for _, opts := range []kubeenv.PropellerOptions{
		{Kubeconfig: "/nonexistent/kubeconfig", Store: store, Namespace: "ns", AgentImage: "agent:dev"},
		{Kubeconfig: "/nonexistent/kubeconfig", Store: store, DefaultPyTorch: "pytorch", DefaultTensorflow: "tensorflow"},
	} {
		p, err := kubeenv.WritePropellerConfig(opts, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "config", "validate", "--strict", "--file", p.ConfigPath).CombinedOutput()
		if err != nil {
			t.Errorf("config validate: %v\n%s", err, out)
		}
	}
}

// cluster is what a test runs workflows on: the test process's API server
// (with the Kubeflow CRDs) and MinIO, a namespace of the test's own, and a
// client that knows FlyteWorkflows.
type cluster struct {
	cfg   *rest.Config
	c     client.Client
	store *testenv.MinIOServer
	ns    string
}

func newCluster(t *testing.T, ns string) cluster {
	t.Helper()
	// The first build on a cold Go cache takes minutes: before any clock.
	kubeenv.BuildPropeller(t)
	cl := cluster{cfg: kubeenv.Kube(t), store: testenv.MinIO(t), ns: ns}
	var err error
	if cl.c, err = client.New(cl.cfg, client.Options{Scheme: kubeenv.FlyteScheme()}); err != nil {
		t.Fatal(err)
	}
	if err := cl.c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return cl
}

// propeller starts a flytepropeller on the cluster, limited to its
// namespace, with opts for the rest.
func (cl cluster) propeller(t *testing.T, opts kubeenv.PropellerOptions) *kubeenv.Propeller {
	t.Helper()
	opts.Kubeconfig, opts.Store, opts.Namespace = kubeenv.Kubeconfig(t, cl.cfg), cl.store, cl.ns
	return kubeenv.StartPropeller(t, opts)
}

// propellerNode is the simulated node the test's pods are bound to.
const propellerNode = "sim-propeller-0"

// TestPropellerRunsElasticTask runs a real flytepropeller with the plugin
// against the envtest API server, the training operator and a simulated
// node (kubeenv.StartSimNodes): a
// FlyteWorkflow of the elastic task template (3:4 workers) is compiled and
// created as flyteadmin would; propeller, through kfelastic-pytorch,
// creates the PyTorchJob with a Master replica running `kfelastic master`
// and the master's Secret, ServiceAccount, Role and RoleBinding; the pods
// are bound to the simulated node, which runs them, and the workflow's node
// reports Running. Then the pods complete and the workflow succeeds. A
// second workflow's worker writes a ValueError document, the job ends,
// and the workflow fails with that root cause as the node's error.
func TestPropellerRunsElasticTask(t *testing.T) {
	if testing.Short() {
		t.Skip("needs flytepropeller, kube-apiserver, the training operator and MinIO")
	}
	const ns = "e2e-propeller"
	cl := newCluster(t, ns)
	kubeenv.StartOperator(t, cl.cfg)
	kubeenv.StartSimNodes(t, cl.cfg, propellerNode)
	started := time.Now()
	p := cl.propeller(t, kubeenv.PropellerOptions{LateDocumentGrace: 3 * time.Second})
	t.Logf("flytepropeller ready %v after its start", time.Since(started).Round(time.Millisecond))
	c := cl.c
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	bound := make(chan struct{})
	go func() { bindPods(ctx, t, c, ns); close(bound) }()
	defer func() { cancel(); <-bound }()

	t.Run("succeeds", func(t *testing.T) {
		fw, job := startElastic(ctx, t, c, p, ns, "elastic-ok")
		setPods(ctx, t, c, job, func(*corev1.Pod) (corev1.PodPhase, int32, string) { return corev1.PodSucceeded, 0, "Completed" })
		o := waitOutcome(ctx, t, c, fw, func(o kubeenv.WorkflowOutcome) bool { return o.Terminal() })
		if o.Phase != v1alpha1.WorkflowPhaseSuccess || o.NodePhase != v1alpha1.NodePhaseSucceeded {
			t.Fatalf("want workflow and node succeeded, got %v", o)
		}
		t.Logf("outcome: %v", o)
	})

	t.Run("fails with the root cause", func(t *testing.T) {
		fw, job := startElastic(ctx, t, c, p, ns, "elastic-bad")
		// Worker 1 raises ValueError: its agent writes the document under
		// the prefix the plugin gave it, and the master ends the job (its
		// pod completes: the operator marks the job Succeeded, and the
		// plugin reads the documents on Succeeded too).
		worker := job.Name + "-worker-1"
		at := time.Now().UTC().Truncate(time.Millisecond)
		writeDocument(ctx, t, errorPrefix(t, job), kferrors.UserError("ValueError", "batch 17 has NaN labels", worker, at))
		setPods(ctx, t, c, job, func(pod *corev1.Pod) (corev1.PodPhase, int32, string) {
			if pod.Name == worker {
				return corev1.PodFailed, 1, "Error"
			}
			return corev1.PodSucceeded, 0, "Completed"
		})
		o := waitOutcome(ctx, t, c, fw, func(o kubeenv.WorkflowOutcome) bool { return o.Terminal() })
		if o.Phase != v1alpha1.WorkflowPhaseFailed || o.NodePhase != v1alpha1.NodePhaseFailed || o.NodeError == nil {
			t.Fatalf("want workflow and node failed with an error, got %v", o)
		}
		t.Logf("outcome: %v", o)
		if msg := o.NodeError.GetMessage(); !strings.Contains(msg, "ValueError: batch 17 has NaN labels") || !strings.Contains(msg, worker) ||
			o.NodeError.GetKind() != core.ExecutionError_USER {
			t.Errorf("node error %s %s %q: want the USER root cause ValueError on %s", o.NodeError.GetKind(), o.NodeError.GetCode(), msg, worker)
		}
		if o.Attempts > 1 {
			t.Errorf("a user error was retried: %v", o)
		}
	})
}

// TestPropellerRoutesTaskTypes: propeller's default-for-task-types sends
// each task type to the plugin configured for it. A tensorflow task
// becomes a TFJob built by kfelastic-tensorflow (error propagation env on
// every replica; upstream's plugin leaves it opt-in); an elastic pytorch
// task becomes kfelastic-pytorch's job (a Master replica running our
// master) by default, and upstream's (workers only, torch's c10d) when
// pytorch is mapped to upstream's plugin, the comparison setup. Only the
// jobs' creation is checked: no operator runs here.
func TestPropellerRoutesTaskTypes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs flytepropeller, kube-apiserver and MinIO")
	}
	for _, tc := range []struct {
		ns, template, defaultPyTorch string
		list                         client.ObjectList
		check                        func(t *testing.T, job client.Object)
	}{
		{"e2e-route-tf", "tensorflow-v1-ps", "", &kubeflowv1.TFJobList{}, func(t *testing.T, job client.Object) {
			for rt, spec := range job.(*kubeflowv1.TFJob).Spec.TFReplicaSpecs {
				if !hasEnv(spec.Template.Spec.Containers[0], kfoperator.EnvWorkerName) {
					t.Errorf("TFJob replica %s has no %s: not built by kfelastic-tensorflow", rt, kfoperator.EnvWorkerName)
				}
			}
		}},
		{"e2e-route-pytorch", "upstream-pytorch-v1-elastic", "", &kubeflowv1.PyTorchJobList{}, func(t *testing.T, job client.Object) {
			if m := job.(*kubeflowv1.PyTorchJob).Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeMaster]; m == nil ||
				m.Template.Spec.Containers[0].Args[0] != "master" {
				t.Errorf("PyTorchJob without the kfelastic master: not built by kfelastic-pytorch")
			}
		}},
		{"e2e-route-upstream", "upstream-pytorch-v1-elastic", "pytorch", &kubeflowv1.PyTorchJobList{}, func(t *testing.T, job client.Object) {
			pj := job.(*kubeflowv1.PyTorchJob)
			if pj.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeMaster] != nil || pj.Spec.ElasticPolicy == nil {
				t.Errorf("want upstream's elastic job (workers only, an elastic policy): %v", pj.Spec)
			}
		}},
	} {
		t.Run(tc.ns, func(t *testing.T) {
			cl := newCluster(t, tc.ns)
			cl.propeller(t, kubeenv.PropellerOptions{DefaultPyTorch: tc.defaultPyTorch})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			fw, err := kubeenv.TaskWorkflow(flytetest.LoadTemplate(t, tc.template), kubeenv.WorkflowOptions{Namespace: tc.ns, Name: "route"})
			if err != nil {
				t.Fatal(err)
			}
			if err := cl.c.Create(ctx, fw); err != nil {
				t.Fatal(err)
			}
			tc.check(t, waitOwned(ctx, t, cl.c, fw, tc.list))
		})
	}
}

func hasEnv(c corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name {
			return true
		}
	}
	return false
}

// startElastic creates the workflow of the elastic template named name,
// waits for propeller to create its PyTorchJob and the master's objects
// and for the node to run, checks them, and logs how long each took.
func startElastic(ctx context.Context, t *testing.T, c client.Client, p *kubeenv.Propeller, ns, name string) (*v1alpha1.FlyteWorkflow, *kubeflowv1.PyTorchJob) {
	t.Helper()
	fw, err := kubeenv.TaskWorkflow(flytetest.LoadTemplate(t, "pytorch-v1-elastic-3-4"), kubeenv.WorkflowOptions{Namespace: ns, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	if err := c.Create(ctx, fw); err != nil {
		t.Fatal(err)
	}
	job := waitJob(ctx, t, c, fw)
	toJob := time.Since(created)
	checkMaster(ctx, t, c, fw, job)
	o := waitOutcome(ctx, t, c, fw, func(o kubeenv.WorkflowOutcome) bool {
		return o.TaskPhase == pluginsCore.PhaseRunning || o.Terminal()
	})
	if o.TaskPhase != pluginsCore.PhaseRunning || o.NodePhase != v1alpha1.NodePhaseRunning || o.Phase != v1alpha1.WorkflowPhaseRunning {
		t.Fatalf("want the task running, got %v", o)
	}
	t.Logf("%s: workflow created → PyTorchJob %s created %v, → task Running %v", name, job.Name,
		toJob.Round(time.Millisecond), time.Since(created).Round(time.Millisecond))
	return fw, job
}

// waitJob waits for the PyTorchJob the workflow owns.
func waitJob(ctx context.Context, t *testing.T, c client.Client, fw *v1alpha1.FlyteWorkflow) *kubeflowv1.PyTorchJob {
	t.Helper()
	return waitOwned(ctx, t, c, fw, &kubeflowv1.PyTorchJobList{}).(*kubeflowv1.PyTorchJob)
}

// waitOwned waits for an object of list's kind, in the workflow's
// namespace, that the workflow owns.
func waitOwned(ctx context.Context, t *testing.T, c client.Client, fw *v1alpha1.FlyteWorkflow, list client.ObjectList) client.Object {
	t.Helper()
	for {
		if err := c.List(ctx, list, client.InNamespace(fw.Namespace)); err != nil {
			t.Fatal(err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			t.Fatal(err)
		}
		for _, item := range items {
			if o, ok := item.(client.Object); ok && ownedBy(o, fw) {
				return o
			}
		}
		select {
		case <-ctx.Done():
			o, _ := kubeenv.Outcome(context.Background(), c, client.ObjectKeyFromObject(fw))
			t.Fatalf("no %T for workflow %s: %v", list, fw.Name, o)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func ownedBy(o metav1.Object, fw *v1alpha1.FlyteWorkflow) bool {
	for _, r := range o.GetOwnerReferences() {
		if r.UID == fw.UID && r.Kind == v1alpha1.FlyteWorkflowKind {
			return true
		}
	}
	return false
}

// checkMaster: the job's Master replica runs `kfelastic master`, and the
// master's Secret, ServiceAccount, Role and RoleBinding exist, owned by the
// workflow as the job is.
func checkMaster(ctx context.Context, t *testing.T, c client.Client, fw *v1alpha1.FlyteWorkflow, job *kubeflowv1.PyTorchJob) {
	t.Helper()
	master := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeMaster]
	if master == nil || len(master.Template.Spec.Containers) == 0 {
		t.Fatalf("PyTorchJob %s has no Master replica: %v", job.Name, job.Spec.PyTorchReplicaSpecs)
	}
	mc := master.Template.Spec.Containers[0]
	if len(mc.Args) == 0 || mc.Args[0] != "master" || master.Template.Spec.ServiceAccountName != kfoperator.MasterAccountName(job.Name) {
		t.Errorf("Master replica: command %v args %v account %q, want `kfelastic master` as %s", mc.Command, mc.Args,
			master.Template.Spec.ServiceAccountName, kfoperator.MasterAccountName(job.Name))
	}
	account := kfoperator.MasterAccountName(job.Name)
	for _, o := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: kfoperator.TokenSecretName(job.Name)}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: account}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: account}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: account}},
	} {
		if err := c.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: o.GetName()}, o); err != nil {
			t.Errorf("%T %s: %v", o, o.GetName(), err)
			continue
		}
		if !ownedBy(o, fw) {
			t.Errorf("%T %s is not owned by the workflow: %v", o, o.GetName(), o.GetOwnerReferences())
		}
	}
}

func waitOutcome(ctx context.Context, t *testing.T, c client.Client, fw *v1alpha1.FlyteWorkflow, done func(kubeenv.WorkflowOutcome) bool) kubeenv.WorkflowOutcome {
	t.Helper()
	o, err := kubeenv.WaitOutcome(ctx, c, client.ObjectKeyFromObject(fw), done)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// bindPods does the scheduler's job until ctx ends: every pod of ns goes to
// the simulated node, which runs it.
func bindPods(ctx context.Context, t *testing.T, c client.Client, ns string) {
	for ctx.Err() == nil {
		if err := kubeenv.BindPods(ctx, c, ns, nil, kubeenv.Nodes(propellerNode)); err != nil && ctx.Err() == nil {
			t.Logf("bind pods: %v", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// setPods ends each pod of job (once it runs) with the phase, exit code
// and reason end gives it, through the status subresource as the kubelet
// does.
func setPods(ctx context.Context, t *testing.T, c client.Client, job *kubeflowv1.PyTorchJob, end func(*corev1.Pod) (corev1.PodPhase, int32, string)) {
	t.Helper()
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(job.Namespace), client.MatchingLabels{kubeflowv1.JobNameLabel: job.Name}); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatalf("job %s has no pods", job.Name)
	}
	now := metav1.Now()
	for _, p := range pods.Items {
		// The node simulator patches the same pods' status: re-read and retry on a
		// conflict, as a controller would.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pod := &corev1.Pod{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(&p), pod); err != nil {
				return err
			}
			phase, code, reason := end(pod)
			pod.Status.Phase = phase
			for i := range pod.Status.ContainerStatuses {
				cs := &pod.Status.ContainerStatuses[i]
				cs.Ready, cs.Started = false, new(bool)
				cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason,
					StartedAt: pod.CreationTimestamp, FinishedAt: now}}
			}
			return c.Status().Update(ctx, pod)
		})
		if err != nil {
			t.Fatalf("end pod %s: %v", p.Name, err)
		}
	}
}

// errorPrefix is the --error-prefix the plugin gave the job's workers.
func errorPrefix(t *testing.T, job *kubeflowv1.PyTorchJob) string {
	t.Helper()
	w := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker]
	args := w.Template.Spec.Containers[0].Args
	for i, a := range args {
		if a == "--error-prefix" && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("worker args have no --error-prefix: %v", args)
	return ""
}

// writeDocument writes f under prefix as the worker's agent does.
func writeDocument(ctx context.Context, t *testing.T, prefix string, f kferrors.Failure) {
	t.Helper()
	b, err := kferrors.OpenPrefix(ctx, prefix, false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := kferrors.NewWriter(b, nil).Write(ctx, f); err != nil {
		t.Fatal(err)
	}
}
