package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flytepropeller/pkg/apis/flyteworkflow/v1alpha1"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// agentVersion is stamped into the agent image the tests import, so that a
// plugin built with it defaults to that image.
const agentVersion = "e2e"

// env is one scenario's cluster, namespace, bucket and clients.
type env struct {
	t       *testing.T
	cluster *kubeenv.Cluster
	kube    client.Client
	ns      string
	minio   *testenv.MinIOServer
	image   string // the agent image
	ckpt    string // host folder mounted at /ckpt in the workers
	// prop is the env's flytepropeller (propeller), flyte a client that
	// knows FlyteWorkflows; nil until a scenario runs a workflow.
	prop  *kubeenv.Propeller
	flyte client.Client
	// defaultPyTorch is the plugin propeller runs pytorch tasks with; ""
	// is ours, "pytorch" upstream's (the comparisons).
	defaultPyTorch string
	// deadline is the scenario's: every wait ends by it (budget).
	deadline time.Time
}

// inNamespace is e in another namespace of the same cluster, operator and
// bucket, with its own checkpoint folder and its own propeller (started on
// first use) whose pytorch tasks go to defaultPyTorch.
func (e *env) inNamespace(ns, defaultPyTorch string) *env {
	e.t.Helper()
	o := *e
	o.ns, o.prop, o.flyte, o.defaultPyTorch = e.cluster.Namespace(e.t, ns), nil, nil, defaultPyTorch
	// A checkpoint folder of its own: a job must not resume from another's.
	o.ckpt = filepath.Join(e.ckpt, ns)
	if err := os.MkdirAll(o.ckpt, 0o755); err != nil {
		e.t.Fatal(err)
	}
	return &o
}

var agentImage struct {
	once sync.Once
	name string
	err  error
}

// scenarioBudget is how long one scenario may take, start to end, on a
// slow machine beside another scenario (KFELASTIC_E2E_BUDGET overrides
// it): every wait is cut to what is left of it, and a scenario that runs
// out fails alone, with its dump, instead of the package's timeout
// killing every test without one.
var scenarioBudget = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KFELASTIC_E2E_BUDGET")); err == nil && d > 0 {
		return d
	}
	return 9 * time.Minute
}()

// sideBySide is how many scenarios share the node at once: what its two
// CPUs can schedule (each scenario's pods request ≈0.7 CPU,
// testdata/e2e/) with room for a replacement pod, and what two cores run
// without starving a scenario's timing.
var sideBySide = make(chan struct{}, 2)

// scenario is newEnv for one of the E scenarios: it runs beside the
// others (t.Parallel), at most len(sideBySide) at a time, each in its own
// namespace, within scenarioBudget.
func scenario(t *testing.T, ns string) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the one-node cluster (run without -short)")
	}
	t.Parallel()
	sideBySide <- struct{}{}
	t.Cleanup(func() { <-sideBySide })
	return newEnv(t, ns)
}

// newEnv is a scenario's world: the cluster (skips where it cannot run),
// the training operator, a namespace and a bucket of its own.
func newEnv(t *testing.T, ns string) *env {
	t.Helper()
	c := kubeenv.UseCluster(t)
	agentImage.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		agentImage.name, agentImage.err = c.ImportAgentImage(ctx, agentVersion)
	})
	if agentImage.err != nil {
		t.Fatal(agentImage.err)
	}
	// One operator for the cluster: scenarios side by side share it. Its
	// workers' init container waits for the master's DNS name with
	// busybox, not a pulled alpine.
	c.UseOperator(t, "--pytorch-init-container-image="+kubeenv.InitImage, "--enable-scheme=tfjob")
	// Propeller's build (minutes on a cold machine, once) is no
	// scenario's time.
	kubeenv.BuildPropeller(t)
	e := &env{t: t, cluster: c, kube: kubeenv.NewClient(t, c.Config), ns: c.Namespace(t, ns), minio: c.MinIO(t),
		image: agentImage.name, ckpt: t.TempDir(), deadline: time.Now().Add(scenarioBudget)}
	t.Cleanup(func() {
		if t.Failed() {
			e.dump()
		}
	})
	return e
}

// limit is d cut to what is left of the scenario's budget, and a word
// for a failure's message when the budget is what ended the wait.
func (e *env) limit(d time.Duration) (time.Duration, string) {
	if left := time.Until(e.deadline); left < d {
		return max(left, 0), fmt.Sprintf(" (the scenario's budget of %v is spent: KFELASTIC_E2E_BUDGET)", scenarioBudget)
	}
	return d, ""
}

// dump logs what a user would look at when a scenario fails: the
// workflow's node status (the Flyte UI), the jobs' conditions, each pod's
// phase, containers and last log lines (the master's among them), and the
// node's kubelet and containerd and the operator.
func (e *env) dump() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.flyte != nil {
		var wfs v1alpha1.FlyteWorkflowList
		if err := e.flyte.List(ctx, &wfs, client.InNamespace(e.ns)); err != nil {
			e.t.Logf("workflows: %v", err)
		}
		for i := range wfs.Items {
			wf := &wfs.Items[i]
			o, err := kubeenv.Outcome(ctx, e.flyte, client.ObjectKeyFromObject(wf))
			e.t.Logf("workflow %s: %v (%v); message %q", wf.Name, o, err, wf.Status.Message)
		}
	}
	var pjs kubeflowv1.PyTorchJobList
	var tjs kubeflowv1.TFJobList
	_ = e.kube.List(ctx, &pjs, client.InNamespace(e.ns))
	_ = e.kube.List(ctx, &tjs, client.InNamespace(e.ns))
	for _, j := range pjs.Items {
		e.t.Logf("PyTorchJob %s: conditions %s; replicas %s", j.Name, conditions(j.Status.Conditions), replicaStatuses(j.Status.ReplicaStatuses))
	}
	for _, j := range tjs.Items {
		e.t.Logf("TFJob %s: conditions %s; replicas %s", j.Name, conditions(j.Status.Conditions), replicaStatuses(j.Status.ReplicaStatuses))
	}
	e.dumpPods()
	for _, name := range []string{"kubelet", "containerd", "training-operator"} {
		e.t.Logf("%s log:\n%s", name, e.cluster.Log(name, 4000))
	}
}

func conditions(cs []kubeflowv1.JobCondition) string {
	var out []string
	for _, c := range cs {
		out = append(out, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return "[" + strings.Join(out, "; ") + "]"
}

func replicaStatuses(rs map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaStatus) string {
	var out []string
	for t, r := range rs {
		if r != nil {
			out = append(out, fmt.Sprintf("%s active=%d succeeded=%d failed=%d", t, r.Active, r.Succeeded, r.Failed))
		}
	}
	return "[" + strings.Join(out, "; ") + "]"
}

// template loads testdata/e2e/NAME.json (a task template as flytekit
// registers it) with the cluster's worker image, the checkpoint folder and
// the S3 endpoint (flytekit's FLYTE_AWS_ENDPOINT) filled in.
func (e *env) template(name string, edit func(*core.TaskTemplate)) *core.TaskTemplate {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "testdata", "e2e", name+".json"))
	if err != nil {
		e.t.Fatal(err)
	}
	tmpl := &core.TaskTemplate{}
	if err := protojson.Unmarshal(data, tmpl); err != nil {
		e.t.Fatalf("%s: %v", name, err)
	}
	pod := tmpl.GetK8SPod().GetPodSpec()
	b, err := pod.MarshalJSON()
	if err != nil {
		e.t.Fatal(err)
	}
	s := strings.NewReplacer("{{worker-image}}", e.cluster.WorkerImage, "{{ckpt-dir}}", e.ckpt,
		"{{s3-endpoint}}", e.minio.Endpoint).Replace(string(b))
	if err := pod.UnmarshalJSON([]byte(s)); err != nil {
		e.t.Fatal(err)
	}
	if edit != nil {
		edit(tmpl)
	}
	return tmpl
}

// job is one launched task: its FlyteWorkflow and the name of the job
// (PyTorchJob, TFJob) propeller made of it, which names its pods.
type job struct {
	e        *env
	name     string
	taskType string
	wf       *v1alpha1.FlyteWorkflow
	created  time.Time
}

// pods are the job's pods now.
func (j *job) pods() []corev1.Pod {
	j.e.t.Helper()
	var list corev1.PodList
	if err := j.e.kube.List(j.e.t.Context(), &list, client.InNamespace(j.e.ns),
		client.MatchingLabels{kubeflowv1.JobNameLabel: j.name}); err != nil {
		j.e.t.Fatal(err)
	}
	return list.Items
}

// logs is what the pod's primary container printed, all its runs
// (container restarts) in order, from the kubelet's log files.
func (j *job) logs(pod string) string {
	container := kubeflowv1.PyTorchJobDefaultContainerName
	if j.taskType == "tensorflow" {
		container = kubeflowv1.TFJobDefaultContainerName
	}
	return j.e.cluster.PodLogs(j.e.ns, pod, container)
}

var stepRE = regexp.MustCompile(`step = (\d+)`)

// waitStep waits until a worker pod's log shows a training step ≥ n after
// since (a log line count to skip) and returns when it did.
func (j *job) waitStep(pod string, n int, limit time.Duration) time.Time {
	j.e.t.Helper()
	limit, why := j.e.limit(limit)
	deadline := time.Now().Add(limit)
	for {
		for _, m := range stepRE.FindAllStringSubmatch(j.logs(pod), -1) {
			var s int
			fmt.Sscan(m[1], &s)
			if s >= n {
				return time.Now()
			}
		}
		if time.Now().After(deadline) {
			j.e.t.Fatalf("pod %s: no step ≥ %d after %v%s; log:\n%s", pod, n, limit, why, tail(j.logs(pod), 3000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// dumpPods logs each pod of the namespace with its status and log tail.
func (e *env) dumpPods() {
	var list corev1.PodList
	if err := e.kube.List(context.Background(), &list, client.InNamespace(e.ns)); err != nil {
		e.t.Logf("pods: %v", err)
		return
	}
	for _, p := range list.Items {
		var states []string
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			states = append(states, fmt.Sprintf("%s restarts=%d state=%+v last=%+v", cs.Name, cs.RestartCount, cs.State, cs.LastTerminationState))
		}
		e.t.Logf("pod %s: %s %s\n  %s\n%s", p.Name, p.Status.Phase, p.Status.Message, strings.Join(states, "\n  "),
			tail(e.cluster.PodLogs(e.ns, p.Name, ""), 3000))
	}
}

// hostPath is a path under the scenario's checkpoint folder.
func (e *env) hostPath(name string) string { return filepath.Join(e.ckpt, name) }

// fileExists reports whether the host file exists.
func fileExists(path string) bool { _, err := os.Stat(path); return err == nil }

// pod is the job's pod name now (fails if absent).
func (j *job) pod(name string) corev1.Pod {
	j.e.t.Helper()
	if p := j.podOrNil(name); p != nil {
		return *p
	}
	j.e.t.Fatalf("no pod %s", name)
	return corev1.Pod{}
}

func (j *job) podOrNil(name string) *corev1.Pod {
	var p corev1.Pod
	if err := j.e.kube.Get(j.e.t.Context(), client.ObjectKey{Namespace: j.e.ns, Name: name}, &p); err != nil {
		return nil
	}
	return &p
}

// waitNewSteps waits until the pod's log holds at least n step lines (a
// count taken before a fault, plus one: a step after it).
func (j *job) waitNewSteps(pod string, n int, limit time.Duration) time.Time {
	j.e.t.Helper()
	limit, why := j.e.limit(limit)
	deadline := time.Now().Add(limit)
	for strings.Count(j.logs(pod), "step = ") < n {
		if time.Now().After(deadline) {
			j.e.t.Fatalf("pod %s: no new step after %v%s; log:\n%s", pod, limit, why, tail(j.logs(pod), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Now()
}

// firstStepRE is a worker's first step: its log line once per start of
// a script that trains from step 0 (no checkpoint).
var firstStepRE = regexp.MustCompile(`(?m)step = 0$`)

// starts counts the worker starts in a pod's log (firstStepRE).
func (j *job) starts(pod string) int { return len(firstStepRE.FindAllStringIndex(j.logs(pod), -1)) }

// waitRestarted waits until a pod's log shows more worker starts than
// before: its workers trained again after a fault. It returns when.
func (j *job) waitRestarted(pod string, before int, limit time.Duration) time.Time {
	j.e.t.Helper()
	limit, why := j.e.limit(limit)
	deadline := time.Now().Add(limit)
	for j.starts(pod) <= before {
		if time.Now().After(deadline) {
			j.e.t.Fatalf("pod %s: its workers did not train again after %v%s; log:\n%s", pod, limit, why, tail(j.logs(pod), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Now()
}

// setStrings sets a container field of a task template's pod spec (a
// protobuf Struct) to a list of strings.
func setStrings(c map[string]*structpb.Value, field string, values ...string) {
	l := make([]any, len(values))
	for i, v := range values {
		l[i] = v
	}
	v, _ := structpb.NewList(l)
	c[field] = structpb.NewListValue(v)
}

// addEnv adds an environment variable to a template's container.
func addEnv(c map[string]*structpb.Value, name, value string) {
	env := c["env"].GetListValue()
	if env == nil {
		env = &structpb.ListValue{}
		c["env"] = structpb.NewListValue(env)
	}
	s, _ := structpb.NewStruct(map[string]any{"name": name, "value": value})
	env.Values = append(env.Values, structpb.NewStructValue(s))
}

// waitRecreated waits until the operator has replaced the deleted pod old:
// a pod of the same name, another UID, Running; it returns when it was.
func (j *job) waitRecreated(old corev1.Pod, limit time.Duration) time.Time {
	j.e.t.Helper()
	limit, why := j.e.limit(limit)
	deadline := time.Now().Add(limit)
	for {
		p := j.podOrNil(old.Name)
		if p != nil && p.UID != old.UID && p.Status.Phase == corev1.PodRunning {
			return time.Now()
		}
		if time.Now().After(deadline) {
			j.e.t.Fatalf("%s was not recreated within %v%s", old.Name, limit, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// propeller is the env's flytepropeller with the plugin, started on first
// use: the cluster's kube-config, the env's bucket as its store (pods reach
// it at the same address), its namespace only, and the agent image
// imported here.
func (e *env) propeller() *kubeenv.Propeller {
	e.t.Helper()
	if e.prop == nil {
		e.prop = kubeenv.StartPropeller(e.t, kubeenv.PropellerOptions{Kubeconfig: kubeenv.Kubeconfig(e.t, e.cluster.Config),
			Store: e.minio, Namespace: e.ns, AgentImage: e.image, LateDocumentGrace: 20 * time.Second,
			DefaultPyTorch: e.defaultPyTorch})
		c, err := client.New(e.cluster.Config, client.Options{Scheme: kubeenv.FlyteScheme()})
		if err != nil {
			e.t.Fatal(err)
		}
		e.flyte = c
		e.t.Cleanup(func() {
			if e.t.Failed() {
				e.t.Logf("flytepropeller output:\n%s", tail(e.prop.Logs(), 6000))
			}
		})
	}
	return e.prop
}

// launched counts the workflows launched per name in this process.
var launched struct {
	sync.Mutex
	n map[string]int
}

// launchWorkflow runs the task as Flyte does: the FlyteWorkflow flyteadmin
// would create for a one-task execution named name (compiled by
// propeller's own compiler), which propeller hands to the plugin. It
// returns once propeller has created the job; the job's name is the task
// execution's, not name.
func (e *env) launchWorkflow(name string, tmpl *core.TaskTemplate) *job {
	e.t.Helper()
	e.propeller()
	// The same scenario run again (-count) names its workflow, and so its
	// job and pods, anew: the pod log mirror keeps the last run's logs
	// under the old names, whose steps must not count.
	launched.Lock()
	if launched.n == nil {
		launched.n = map[string]int{}
	}
	if launched.n[name]++; launched.n[name] > 1 {
		name = fmt.Sprintf("%s-%d", name, launched.n[name])
	}
	launched.Unlock()
	fw, err := kubeenv.TaskWorkflow(tmpl, kubeenv.WorkflowOptions{Namespace: e.ns, Name: name,
		RawOutputPrefix: "s3://" + e.minio.Bucket + "/raw"})
	if err != nil {
		e.t.Fatal(err)
	}
	created := time.Now()
	if err := e.flyte.Create(e.t.Context(), fw); err != nil {
		e.t.Fatal(err)
	}
	limit, _ := e.limit(3 * time.Minute)
	ctx, cancel := context.WithTimeout(e.t.Context(), limit)
	defer cancel()
	var list client.ObjectList = &kubeflowv1.PyTorchJobList{}
	if tmpl.GetType() == "tensorflow" {
		list = &kubeflowv1.TFJobList{}
	}
	kj := waitOwned(ctx, e.t, e.flyte, fw, list)
	return &job{e: e, name: kj.GetName(), taskType: tmpl.GetType(), wf: fw, created: created}
}

// succeeds waits up to limit for the workflow's end and fails the test
// unless it and its node succeeded.
func (j *job) succeeds(limit time.Duration) {
	j.e.t.Helper()
	if o := j.outcome(limit); o.Phase != v1alpha1.WorkflowPhaseSuccess || o.NodePhase != v1alpha1.NodePhaseSucceeded {
		j.e.t.Fatalf("want the workflow and its node succeeded, got %v", o)
	}
}

// outcome waits up to limit for the workflow's terminal outcome: what the
// Flyte UI shows, read from the FlyteWorkflow's node status.
func (j *job) outcome(limit time.Duration) kubeenv.WorkflowOutcome {
	j.e.t.Helper()
	limit, why := j.e.limit(limit)
	ctx, cancel := context.WithTimeout(j.e.t.Context(), limit)
	defer cancel()
	o, err := kubeenv.WaitOutcome(ctx, j.e.flyte, client.ObjectKeyFromObject(j.wf), func(o kubeenv.WorkflowOutcome) bool { return o.Terminal() })
	if err != nil {
		j.e.t.Fatalf("workflow %s not terminal after %v%s: %v (%v); pods: %s", j.wf.Name, limit, why, o, err, j.podStates())
	}
	return o
}

// podStates is one line per pod of the job: phase and each container's
// state, for a failure's first lines (CI shows those; the dump at the end
// may be cut).
func (j *job) podStates() string {
	var list corev1.PodList
	if err := j.e.kube.List(context.Background(), &list, client.InNamespace(j.e.ns),
		client.MatchingLabels{kubeflowv1.JobNameLabel: j.name}); err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range list.Items {
		line := fmt.Sprintf("%s %s", p.Name, p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			switch {
			case cs.State.Terminated != nil:
				line += fmt.Sprintf(" %s exited %d (%s)", cs.Name, cs.State.Terminated.ExitCode, cs.State.Terminated.Reason)
			case cs.State.Waiting != nil:
				line += fmt.Sprintf(" %s waiting (%s)", cs.Name, cs.State.Waiting.Reason)
			case cs.State.Running != nil:
				line += fmt.Sprintf(" %s running, %d restarts", cs.Name, cs.RestartCount)
			}
		}
		out = append(out, line)
	}
	return "[" + strings.Join(out, "; ") + "]"
}

// outcomeNow is the workflow's outcome as its status says it now.
func (j *job) outcomeNow() kubeenv.WorkflowOutcome {
	j.e.t.Helper()
	o, err := kubeenv.Outcome(j.e.t.Context(), j.e.flyte, client.ObjectKeyFromObject(j.wf))
	if err != nil {
		j.e.t.Fatal(err)
	}
	return o
}

// deletePod deletes the pod as `kubectl delete pod` does (its grace period)
// and returns when: the time of the fault.
func (j *job) deletePod(p corev1.Pod) time.Time {
	j.e.t.Helper()
	fault := time.Now()
	if err := j.e.kube.Delete(j.e.t.Context(), &p); err != nil {
		j.e.t.Fatal(err)
	}
	return fault
}
