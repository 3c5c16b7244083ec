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
// master runs `kfelastic master`. flytekit's pyflyte-execute starts its own
// workers through torch's elastic_launch, so the agent runs it once
// (--launcher command); any other command gets the agent's own launcher.
// Without an AgentImage the image of this build's version installs the agent.
func ExampleBuildPyTorchJob() {
	custom, _ := structpb.NewStruct(map[string]any{
		"workerReplicas": map[string]any{"replicas": 4},
		"elasticConfig":  map[string]any{"rdzvBackend": "c10d", "minReplicas": 2, "maxReplicas": 4, "nprocPerNode": 2, "maxRestarts": 3},
	})
	for _, args := range [][]string{
		{"pyflyte-execute", "--inputs", "s3://flyte/metadata/f3a/inputs.pb", "--", "task-module", "train", "task-name", "fit"},
		{"python3", "train.py", "--lr", "0.1"},
	} {
		container := &core.Container{Image: "trainer:1", Args: args}
		tmpl := &core.TaskTemplate{Type: "pytorch", TaskTypeVersion: 1, Custom: custom, Target: &core.TaskTemplate_Container{Container: container}}
		job, err := kfoperator.BuildPyTorchJob(tmpl, onePod{container}, kfoperator.Options{
			Name: "f3a-n0-0", Namespace: "flytesnacks-development", ErrorPrefix: "s3://flyte/metadata/f3a/n0/data/0",
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		w := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker].Template.Spec
		fmt.Println("worker:", strings.Join(append(w.Containers[0].Command, w.Containers[0].Args...), " "))
		if args[0] != "pyflyte-execute" {
			continue
		}
		m := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeMaster].Template.Spec.Containers[0]
		fmt.Println("init:", strings.Join(w.InitContainers[0].Command, " "))
		fmt.Println("master:", strings.Join(append(m.Command, m.Args[:5]...), " "), "…")
		fmt.Println("default image:", w.InitContainers[0].Image == kfoperator.DefaultAgentImage() && m.Image == kfoperator.DefaultAgentImage())
		fmt.Println("gang minimum:", *job.Spec.RunPolicy.SchedulingPolicy.MinAvailable)
	}
	// Output:
	// worker: /kfelastic-bin/kfelastic agent --launcher command --error-prefix s3://flyte/metadata/f3a/n0/data/0 --nnodes 2:4 --max-restarts 0 --rdzv-endpoint f3a-n0-0-master-0:23456 --rdzv-id f3a-n0-0 --token-file /etc/kfelastic/token -- pyflyte-execute --inputs s3://flyte/metadata/f3a/inputs.pb -- task-module train task-name fit
	// init: /kfelastic install /kfelastic-bin
	// master: /kfelastic master --rdzv-id f3a-n0-0 --listen :23456 …
	// default image: true
	// gang minimum: 3
	// worker: /kfelastic-bin/kfelastic agent --launcher agent --error-prefix s3://flyte/metadata/f3a/n0/data/0 --nnodes 2:4 --nproc-per-node 2 --max-restarts 3 --rdzv-endpoint f3a-n0-0-master-0:23456 --rdzv-id f3a-n0-0 --token-file /etc/kfelastic/token -- python3 train.py --lr 0.1
}
