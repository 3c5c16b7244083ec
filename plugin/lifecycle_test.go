package plugin

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/flytetest"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
)

// TestLifecycleWithTrainingOperator runs the real Kubeflow training operator
// and a simulated node (kubeenv.StartSimNodes) against the envtest API server and
// drives a PyTorchJob through flytepropeller's plugin manager: created by
// the plugin, pods created by the operator, bound to the simulated node by
// the test (there is no kube-scheduler here), started by its simulator,
// Running; then one
// worker is OOM-killed (its status set as the kubelet would), the operator
// fails the job, and the plugin reports a system-retryable OOMKilled on that
// worker, synthesized from its pod status since it left no document. Then
// two elastic jobs run up to Running, one of them flytekit's Elastic task
// with the default config (no agentImage set), and their pods are checked
// as the operator made them.
func TestLifecycleWithTrainingOperator(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver and the training operator")
	}
	e := newManagerEnv(t, "flyte-lifecycle", "pytorch")
	e.cfg.LateDocumentGrace.Duration = 3 * time.Second
	cfg := kubeenv.Kube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kubeenv.StartOperator(t, cfg)
	kubeenv.StartSimNodes(t, cfg, lifecycleNode)

	tctx, job := e.launch(t, "lifecycle", "pytorch-v1-two-workers")
	// Running: the operator made 3 pods, we bind them, the node simulator runs them.
	phase := waitPhase(ctx, t, e, tctx, job, func(p pluginsCore.PhaseInfo) bool { return p.Phase() == pluginsCore.PhaseRunning })
	t.Logf("running: %v", phase)

	oomAt := time.Now().UTC().Truncate(time.Second)
	// The node simulator patches the same pod's status concurrently: re-read and retry on a
	// conflict, as a controller would.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		worker := &corev1.Pod{}
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "lifecycle-worker-1"}, worker); err != nil {
			return err
		}
		worker.Status.Phase = corev1.PodFailed
		for i := range worker.Status.ContainerStatuses {
			cs := &worker.Status.ContainerStatuses[i]
			if cs.Name == "pytorch" {
				cs.Ready, cs.Started = false, ptr(false)
				cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137,
					StartedAt: metav1.NewTime(oomAt.Add(-time.Minute)), FinishedAt: metav1.NewTime(oomAt)}}
			}
		}
		return e.c.Status().Update(ctx, worker)
	})
	if err != nil {
		t.Fatal(err)
	}
	// A peer's secondary failure, written a second later.
	e.writeDocument(t, tctx, kferrors.UserError("DistNetworkError", "Connection closed by peer", "lifecycle-worker-0", oomAt.Add(1500*time.Millisecond)))

	final := waitPhase(ctx, t, e, tctx, job, func(p pluginsCore.PhaseInfo) bool { return p.Phase().IsTerminal() })
	checkErr(t, final, pluginsCore.PhaseRetryableFailure, kferrors.CodeOOMKilled, core.ExecutionError_SYSTEM, "lifecycle-worker-1", oomAt,
		"OOMKilled: pod lifecycle-worker-1", "1× DistNetworkError")
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
		t.Fatal(err)
	}
	if c, ok := jobCondition(job); !ok || c.Type != kubeflowv1.JobFailed {
		t.Errorf("the operator left the job at %+v", job.Status.Conditions)
	}

	// Elastic jobs: the operator renders our master and agent-wrapped
	// workers, pointing the workers' PET_* defaults at the kfelastic master.
	// One with the configured image and a plain command (--launcher agent);
	// flytekit's Elastic task with the default config, no agentImage set
	// (the image of the plugin's version; --launcher command).
	for _, j := range []struct {
		name, template, image, launcher, nnodes string
		workers                                 int
	}{
		{"elastic", "upstream-pytorch-v1-elastic", e.cfg.AgentImage, "agent", "1:2", 2},
		{"flytekit", "flytekit-elastic-pyflyte-execute", DefaultConfig().AgentImage, "command", "2:4", 4},
	} {
		e.cfg.AgentImage = j.image
		etctx, ejob := e.launch(t, j.name, j.template)
		waitPhase(ctx, t, e, etctx, ejob, func(p pluginsCore.PhaseInfo) bool { return p.Phase() == pluginsCore.PhaseRunning })
		checkElasticPods(ctx, t, e, j.name, j.image, j.launcher, j.nnodes, j.workers)
	}
}

// checkElasticPods: the operator made the master and the workers of an
// elastic job as the plugin rendered them — the master running `kfelastic
// master` from image under its account; each worker installing the agent
// from image (`/kfelastic install`) and running its command under `agent
// --launcher launcher`, with the operator's PET_* pointing at the master.
func checkElasticPods(ctx context.Context, t *testing.T, e *managerEnv, job, image, launcher, nnodes string, workers int) {
	t.Helper()
	var pods corev1.PodList
	if err := e.c.List(ctx, &pods, client.InNamespace(e.ns), client.MatchingLabels{kubeflowv1.JobNameLabel: job}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, p := range pods.Items {
		seen[p.Name] = true
		c := p.Spec.Containers[0]
		if p.Name == job+"-master-0" {
			if p.Spec.ServiceAccountName != job+"-kfelastic-master" || c.Args[0] != "master" || c.Image != image {
				t.Errorf("master pod: account %q image %q args %v", p.Spec.ServiceAccountName, c.Image, c.Args)
			}
			continue
		}
		env := map[string]string{}
		for _, v := range c.Env {
			env[v.Name] = v.Value
		}
		if env["PET_RDZV_ENDPOINT"] != job+"-master-0:23456" || env["PET_NNODES"] != nnodes || c.Command[0] != "/kfelastic-bin/kfelastic" ||
			strings.Join(c.Args[:3], " ") != "agent --launcher "+launcher {
			t.Errorf("worker pod %s: command %v %v, PET_RDZV_ENDPOINT %q PET_NNODES %q", p.Name, c.Command, c.Args, env["PET_RDZV_ENDPOINT"], env["PET_NNODES"])
		}
		installed := false
		for _, ic := range p.Spec.InitContainers {
			installed = installed || ic.Name == "kfelastic-install" && ic.Image == image &&
				strings.Join(ic.Command, " ") == "/kfelastic install /kfelastic-bin"
		}
		if !installed {
			t.Errorf("worker pod %s has no kfelastic-install init container running /kfelastic install from %s: %+v", p.Name, image, p.Spec.InitContainers)
		}
	}
	want := []string{job + "-master-0"}
	for i := range workers {
		want = append(want, fmt.Sprintf("%s-worker-%d", job, i))
	}
	for _, name := range want {
		if !seen[name] {
			t.Errorf("%s: pods %v, want %v", job, seen, want)
			break
		}
	}
}

// lifecycleNode is the simulated node the test's pods are bound to.
const lifecycleNode = "sim-node-0"

func jobCondition(job *kubeflowv1.PyTorchJob) (kubeflowv1.JobCondition, bool) {
	for i := len(job.Status.Conditions) - 1; i >= 0; i-- {
		if job.Status.Conditions[i].Status == corev1.ConditionTrue {
			return job.Status.Conditions[i], true
		}
	}
	return kubeflowv1.JobCondition{}, false
}

// waitPhase runs propeller's rounds (the plugin manager's Handle) every
// 300 ms, binding the job's pods to the simulated node as a scheduler would,
// until done accepts the phase.
func waitPhase(ctx context.Context, t *testing.T, e *managerEnv, tctx *flytetest.Context, job *kubeflowv1.PyTorchJob, done func(pluginsCore.PhaseInfo) bool) pluginsCore.PhaseInfo {
	t.Helper()
	var last pluginsCore.PhaseInfo
	for {
		var pods corev1.PodList
		if err := e.c.List(ctx, &pods, client.InNamespace(e.ns), client.MatchingLabels{kubeflowv1.JobNameLabel: job.Name}); err != nil {
			t.Fatal(err)
		}
		if err := kubeenv.BindPods(ctx, e.c, e.ns, map[string]string{kubeflowv1.JobNameLabel: job.Name}, kubeenv.Nodes(lifecycleNode)); err != nil {
			t.Fatal(err)
		}
		last = e.handle(t, tctx)
		if done(last) {
			return last
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out; last phase %v, %d pods", last, len(pods.Items))
		case <-time.After(300 * time.Millisecond):
		}
	}
}
