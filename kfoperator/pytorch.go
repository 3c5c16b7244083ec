package kfoperator

import (
	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/plugins"
	kfplugins "github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/plugins/kubeflow"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/utils"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
)

// elasticConfig is what versions 0 and 1 of flyteidl's ElasticConfig share.
type elasticConfig interface {
	GetMinReplicas() int32
	GetMaxReplicas() int32
	GetNprocPerNode() int32
	GetMaxRestarts() int32
	GetRdzvBackend() string
}

// BuildPyTorchJob builds the PyTorchJob of a "pytorch" task: version 0
// (plugins.DistributedPyTorchTrainingTask: one template, `workers` workers)
// or version 1 (kubeflow.DistributedPyTorchTrainingTask: master and worker
// replica specs with their own image, resources and restart policy, a
// RunPolicy). An ElasticConfig makes an elastic job driven by the kfelastic
// agent and master. Bad specs give BadTaskSpecification errors.
func BuildPyTorchJob(tmpl *core.TaskTemplate, pt PodTemplater, opts Options) (*kubeflowv1.PyTorchJob, error) {
	if err := readTemplate(tmpl, PyTorchTaskType); err != nil {
		return nil, err
	}
	var (
		master, worker *kubeflowv1.ReplicaSpec
		rp             kubeflowv1.RunPolicy
		elastic        elasticConfig
		err            error
	)
	switch v := tmpl.GetTaskTypeVersion(); v {
	case 0:
		var spec plugins.DistributedPyTorchTrainingTask
		if err := utils.UnmarshalStruct(tmpl.GetCustom(), &spec); err != nil {
			return nil, badSpec("invalid pytorch v0 task spec: %v", err)
		}
		if spec.GetWorkers() <= 0 {
			return nil, badSpec("pytorch task: workers must be at least 1, got %d", spec.GetWorkers())
		}
		if master, err = replicaSpec(pt, replicaFields{replicas: 1}, kubeflowv1.PyTorchJobDefaultContainerName); err != nil {
			return nil, err
		}
		if worker, err = replicaSpec(pt, replicaFields{replicas: spec.GetWorkers()}, kubeflowv1.PyTorchJobDefaultContainerName); err != nil {
			return nil, err
		}
		if ec := spec.GetElasticConfig(); ec != nil {
			elastic = ec
		}
	case 1:
		var spec kfplugins.DistributedPyTorchTrainingTask
		if err := utils.UnmarshalStruct(tmpl.GetCustom(), &spec); err != nil {
			return nil, badSpec("invalid pytorch v1 task spec: %v", err)
		}
		if spec.GetWorkerReplicas() == nil {
			return nil, badSpec("pytorch task: worker_replicas is missing")
		}
		wf := fieldsOf(spec.GetWorkerReplicas())
		if wf.replicas <= 0 {
			return nil, badSpec("pytorch task: worker replicas must be at least 1, got %d", wf.replicas)
		}
		// The master is always one pod; its replica count in the spec
		// (flytekit writes 0 or 1) is not a count to honour.
		mf := fieldsOf(spec.GetMasterReplicas())
		mf.replicas = 1
		if master, err = replicaSpec(pt, mf, kubeflowv1.PyTorchJobDefaultContainerName); err != nil {
			return nil, err
		}
		if worker, err = replicaSpec(pt, wf, kubeflowv1.PyTorchJobDefaultContainerName); err != nil {
			return nil, err
		}
		if rp, err = runPolicy(spec.GetRunPolicy()); err != nil {
			return nil, err
		}
		if ec := spec.GetElasticConfig(); ec != nil {
			elastic = ec
		}
	default:
		return nil, badSpec("pytorch task: unsupported task type version %d (known: 0, 1)", v)
	}

	job := &kubeflowv1.PyTorchJob{
		TypeMeta: typeMeta(kubeflowv1.PyTorchJobKind),
		Spec: kubeflowv1.PyTorchJobSpec{
			RunPolicy: rp,
			PyTorchReplicaSpecs: map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaSpec{
				kubeflowv1.PyTorchJobReplicaTypeMaster: master,
				kubeflowv1.PyTorchJobReplicaTypeWorker: worker,
			},
		},
	}
	if elastic != nil {
		if err := makeElastic(job, elastic, opts); err != nil {
			return nil, err
		}
	}
	return job, nil
}
