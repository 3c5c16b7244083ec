package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flytepropeller/pkg/apis/flyteworkflow/v1alpha1"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kfelastic/kfelastic/kfoperator"
)

// E1: an elastic task, Elastic(nnodes="2:3", nproc_per_node=2), runs as
// Flyte runs it: a FlyteWorkflow that flytepropeller hands to the plugin.
// It trains to its last step on two worker pods beside the kfelastic
// master, and the workflow's node succeeds. The training operator numbers
// the workers from 1 beside a Master replica; the agents must still form
// ranks 0 and 1 (they used to hang: the last was refused as rank 2 of 2).
func TestE1ElasticTrainsToTheEnd(t *testing.T) {
	e := scenario(t, "e1")
	j := e.launchWorkflow("e1", e.template("elastic-2-3", nil))
	w0, w1 := j.name+"-worker-0", j.name+"-worker-1"
	first := j.waitStep(w0, 0, 5*time.Minute)
	t.Logf("E1: workflow created → first training step: %.1fs", first.Sub(j.created).Seconds())
	o := j.outcome(5 * time.Minute)
	if o.Phase != v1alpha1.WorkflowPhaseSuccess || o.NodePhase != v1alpha1.NodePhaseSucceeded {
		t.Fatalf("want the workflow and its node succeeded, got %v", o)
	}
	for _, pod := range []string{w0, w1} {
		log := j.logs(pod)
		if !strings.Contains(log, "step = 59") {
			t.Errorf("%s did not train to step 59:\n%s", pod, tail(log, 2000))
		}
	}
	// The agents formed one group of 2 nodes × 2 workers, worker-1 as node
	// rank 1 (the operator's PET_NODE_RANK there is 2).
	if log := j.logs(w1); !strings.Contains(log, "group_rank=1\n  group_world_size=2") {
		t.Errorf("worker-1's agent did not join as node 1 of 2:\n%s", tail(log, 3000))
	}
}

// E3: `kubectl delete pod` of worker 1 mid-training: the operator recreates
// it under its name, the new pod takes rank 1 back, training resumes from
// the checkpoint, and the task succeeds.
func TestE3DeletedWorkerComesBack(t *testing.T) {
	e := scenario(t, "e3")
	tmpl := e.template("elastic-2-3", func(tmpl *core.TaskTemplate) {
		c := tmpl.GetK8SPod().GetPodSpec().GetFields()["containers"].GetListValue().GetValues()[0].GetStructValue().GetFields()
		setStrings(c, "args", "--steps", "150", "--sleep", "0.1", "--ckpt-dir", "/ckpt", "--ckpt-every", "5")
	})
	j := e.launchWorkflow("e3", tmpl)
	j.waitStep(j.name+"-worker-0", 20, 5*time.Minute)
	victim := j.pod(j.name + "-worker-1")
	fault := j.deletePod(victim)
	// The replacement has the same name and a new UID.
	j.waitRecreated(victim, 3*time.Minute)
	before := strings.Count(j.logs(j.name+"-worker-0"), "step = ")
	resumed := j.waitNewSteps(j.name+"-worker-0", before+1, 3*time.Minute)
	t.Logf("E3: pod deleted → first training step after recovery: %.1fs", resumed.Sub(fault).Seconds())
	j.succeeds(6 * time.Minute)
	if log := j.logs(j.name + "-worker-1"); !strings.Contains(log, "step = 149") {
		t.Errorf("the replacement did not train to the end:\n%s", tail(log, 2000))
	}
}

// E5: the Master pod (the kfelastic master) is deleted mid-training: the
// operator recreates it, it reloads its state from the task's prefix, and
// the agents carry on: no training restart, the task succeeds.
func TestE5MasterPodDeleted(t *testing.T) {
	e := scenario(t, "e5")
	tmpl := e.template("elastic-2-3", func(tmpl *core.TaskTemplate) {
		c := tmpl.GetK8SPod().GetPodSpec().GetFields()["containers"].GetListValue().GetValues()[0].GetStructValue().GetFields()
		setStrings(c, "args", "--steps", "150", "--sleep", "0.1", "--ckpt-dir", "/ckpt", "--ckpt-every", "5")
	})
	j := e.launchWorkflow("e5", tmpl)
	j.waitStep(j.name+"-worker-0", 20, 5*time.Minute)
	rounds := strings.Count(j.logs(j.name+"-worker-0"), "Rendezvous complete")
	master := j.pod(j.name + "-master-0")
	fault := j.deletePod(master)
	running := j.waitRecreated(master, 3*time.Minute)
	t.Logf("E5: master pod deleted → replacement running: %.1fs", running.Sub(fault).Seconds())
	j.succeeds(6 * time.Minute)
	if after := strings.Count(j.logs(j.name+"-worker-0"), "Rendezvous complete"); after != rounds {
		t.Errorf("training restarted: %d rendezvous rounds before the master went, %d at the end", rounds, after)
	}
	if log := e.cluster.PodLogs(e.ns, j.name+"-master-0", ""); !strings.Contains(log, "state") {
		t.Logf("new master's log:\n%s", tail(log, 2000))
	}
}

// E6: a real OOM kill. Global rank 2 (worker-1's first worker) allocates
// past its container's memory limit; the kernel kills it, the kubelet
// reports OOMKilled, and the kfelastic master relaunches the pod with twice
// the memory through its own service account; training resumes from the
// checkpoint and the task succeeds.
func TestE6OOMKilledWorkerGetsMoreMemory(t *testing.T) {
	e := scenario(t, "e6")
	tmpl := e.template("elastic-2-3", func(tmpl *core.TaskTemplate) {
		c := tmpl.GetK8SPod().GetPodSpec().GetFields()["containers"].GetListValue().GetValues()[0].GetStructValue().GetFields()
		setStrings(c, "args", "--steps", "60", "--sleep", "0.1", "--ckpt-dir", "/ckpt", "--ckpt-every", "5", "--alloc-at", "15:1800:2")
		// The task's resources, as @task(requests=…, limits=…) gives them.
		res, _ := structpb.NewStruct(map[string]any{"requests": map[string]any{"cpu": "300m", "memory": "1Gi"},
			"limits": map[string]any{"cpu": "1", "memory": "1536Mi"}})
		c["resources"] = structpb.NewStructValue(res)
	})
	j := e.launchWorkflow("e6", tmpl)
	j.waitStep(j.name+"-worker-1", 10, 5*time.Minute)
	var fault time.Time
	var oom corev1.Pod
	limit, why := e.limit(3 * time.Minute)
	for deadline := time.Now().Add(limit); fault.IsZero(); {
		for _, p := range j.pods() {
			for _, cs := range p.Status.ContainerStatuses {
				if t := cs.State.Terminated; t != nil && t.Reason == "OOMKilled" {
					fault, oom = t.FinishedAt.Time, p
				} else if t := cs.LastTerminationState.Terminated; t != nil && t.Reason == "OOMKilled" {
					fault, oom = t.FinishedAt.Time, p
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no container was OOMKilled within %v%s", limit, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
	before := strings.Count(j.logs(j.name+"-worker-0"), "step = ")
	resumed := j.waitNewSteps(j.name+"-worker-0", before+1, 4*time.Minute)
	t.Logf("E6: %s OOMKilled at %s → first training step after recovery: %.1fs (the kubelet's finish time is whole seconds)",
		oom.Name, fault.Format(time.RFC3339), resumed.Sub(fault).Seconds())
	j.succeeds(8 * time.Minute)
	got := j.pod(oom.Name)
	if lim := got.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]; lim.Cmp(resource.MustParse("3Gi")) < 0 {
		t.Errorf("%s relaunched with memory limit %s, want 3Gi (twice 1536Mi)", oom.Name, lim.String())
	}
}

// E8: when the FlyteWorkflow is deleted, everything the task made goes
// with it: the job, its pods, and the plugin's Secret, ServiceAccount, Role
// and RoleBinding (owner references, the garbage collector).
func TestE8DeletedWorkflowLeavesNothing(t *testing.T) {
	e := scenario(t, "e8")
	j := e.launchWorkflow("e8", e.template("elastic-2-3", nil))
	j.waitStep(j.name+"-worker-0", 0, 5*time.Minute)
	// As `flytectl delete execution` ends in flyteadmin: the FlyteWorkflow
	// goes; propeller aborts the task and lets go of its finalizer.
	if err := e.flyte.Delete(t.Context(), j.wf, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	limit, why := e.limit(3 * time.Minute)
	deadline := time.Now().Add(limit)
	for {
		var left []string
		for _, o := range []client.Object{&kubeflowv1.PyTorchJob{}, &corev1.Secret{}, &corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}} {
			name := j.name
			switch o.(type) {
			case *corev1.Secret:
				name = kfoperator.TokenSecretName(j.name)
			case *corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding:
				name = kfoperator.MasterAccountName(j.name)
			}
			if err := e.kube.Get(t.Context(), client.ObjectKey{Namespace: e.ns, Name: name}, o); err == nil {
				left = append(left, fmt.Sprintf("%T %s", o, name))
			}
		}
		for _, p := range j.pods() {
			left = append(left, "pod "+p.Name)
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left %v after the workflow was deleted%s: %s", limit, why, strings.Join(left, ", "))
		}
		time.Sleep(time.Second)
	}
}

// E7: a TFJob of parameter-server training (one ps, three workers, worker 0
// the chief, as TF1 without a chief task; the parameter-server stand-in): a
// worker's pod is deleted, the operator recreates it under its name (the
// plugin set enableDynamicWorker: without it the operator fails the job at
// the deletion), and training goes on to the last step.
func TestE7TFWorkerDeleted(t *testing.T) {
	e := scenario(t, "e7")
	j := e.launchWorkflow("e7", e.template("tf-ps", nil))
	j.waitStep(j.name+"-worker-0", 30, 5*time.Minute)
	victim := j.pod(j.name + "-worker-1")
	before := strings.Count(j.logs(j.name+"-worker-1"), "step = ")
	fault := j.deletePod(victim)
	j.waitRecreated(victim, 3*time.Minute)
	resumed := j.waitNewSteps(j.name+"-worker-1", before+1, 3*time.Minute)
	t.Logf("E7: TF worker pod deleted → its first step after recovery: %.1fs", resumed.Sub(fault).Seconds())
	j.succeeds(6 * time.Minute)
}
