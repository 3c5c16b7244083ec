package kfoperator_test

import (
	"fmt"
	"strings"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"

	"github.com/kfelastic/kfelastic/kfoperator"
)

// onePod renders every replica from the task's container as is.
type onePod struct{ c *core.Container }

func (p onePod) PodTemplate(*core.Resources) (corev1.PodTemplateSpec, string, error) {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "main", Image: p.c.GetImage(), Args: p.c.GetArgs()},
	}}}, "main", nil
}

// An elastic PyTorch task (flytekit's Elastic(nnodes="2:4", nproc_per_node=2))
// becomes a PyTorchJob whose workers run under the kfelastic agent and whose
// master runs `kfelastic master`.
func ExampleBuildPyTorchJob() {
	custom, _ := structpb.NewStruct(map[string]any{
		"workerReplicas": map[string]any{"replicas": 2},
		"elasticConfig":  map[string]any{"minReplicas": 2, "maxReplicas": 4, "nprocPerNode": 2, "maxRestarts": 3},
	})
	container := &core.Container{Image: "trainer:1", Args: []string{"pyflyte-execute", "--task-module", "train"}}
	tmpl := &core.TaskTemplate{Type: "pytorch", TaskTypeVersion: 1, Custom: custom, Target: &core.TaskTemplate_Container{Container: container}}
	job, err := kfoperator.BuildPyTorchJob(tmpl, onePod{container}, kfoperator.Options{
		Name: "f3a-n0-0", Namespace: "flytesnacks-development",
		ErrorPrefix: "s3://flyte/metadata/f3a/n0/data/0", AgentImage: "ghcr.io/kfelastic/kfelastic:v0.1.0",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	w := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker].Template.Spec.Containers[0]
	m := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeMaster].Template.Spec.Containers[0]
	fmt.Println("worker:", strings.Join(append(w.Command, w.Args...), " "))
	fmt.Println("master:", strings.Join(append(m.Command, m.Args[:5]...), " "), "…")
	fmt.Println("gang minimum:", *job.Spec.RunPolicy.SchedulingPolicy.MinAvailable)
	// Output:
	// worker: /kfelastic-bin/kfelastic agent --error-prefix s3://flyte/metadata/f3a/n0/data/0 --nnodes 2:4 --nproc-per-node 2 --max-restarts 3 --rdzv-endpoint f3a-n0-0-master-0:23456 --rdzv-id f3a-n0-0 --token-file /etc/kfelastic/token -- pyflyte-execute --task-module train
	// master: /kfelastic master --rdzv-id f3a-n0-0 --listen :23456 …
	// gang minimum: 3
}
