package kfoperator

import (
	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/plugins"
	kfplugins "github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/plugins/kubeflow"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/utils"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
)

// tfReplicaTypes is the order replicas are built and reported in.
var tfReplicaTypes = []kubeflowv1.ReplicaType{
	kubeflowv1.TFJobReplicaTypeChief,
	kubeflowv1.TFJobReplicaTypeWorker,
	kubeflowv1.TFJobReplicaTypePS,
	kubeflowv1.TFJobReplicaTypeEval,
}

// BuildTFJob builds the TFJob of a "tensorflow" task: version 0
// (plugins.DistributedTensorflowTrainingTask: counts of chief, workers, ps,
// evaluators over one template) or version 1
// (kubeflow.DistributedTensorflowTrainingTask: a replica spec per type, a
// RunPolicy). Types with no replicas are left out; at least one worker is
// required and at most one chief.
func BuildTFJob(tmpl *core.TaskTemplate, pt PodTemplater, opts Options) (*kubeflowv1.TFJob, error) {
	if err := readTemplate(tmpl, TensorflowTaskType); err != nil {
		return nil, err
	}
	fields := map[kubeflowv1.ReplicaType]replicaFields{}
	var rp kubeflowv1.RunPolicy
	switch v := tmpl.GetTaskTypeVersion(); v {
	case 0:
		var spec plugins.DistributedTensorflowTrainingTask
		if err := utils.UnmarshalStruct(tmpl.GetCustom(), &spec); err != nil {
			return nil, badSpec("invalid tensorflow v0 task spec: %v", err)
		}
		fields[kubeflowv1.TFJobReplicaTypeChief] = replicaFields{replicas: spec.GetChiefReplicas()}
		fields[kubeflowv1.TFJobReplicaTypeWorker] = replicaFields{replicas: spec.GetWorkers()}
		fields[kubeflowv1.TFJobReplicaTypePS] = replicaFields{replicas: spec.GetPsReplicas()}
		fields[kubeflowv1.TFJobReplicaTypeEval] = replicaFields{replicas: spec.GetEvaluatorReplicas()}
	case 1:
		var spec kfplugins.DistributedTensorflowTrainingTask
		if err := utils.UnmarshalStruct(tmpl.GetCustom(), &spec); err != nil {
			return nil, badSpec("invalid tensorflow v1 task spec: %v", err)
		}
		for t, rs := range map[kubeflowv1.ReplicaType]*kfplugins.DistributedTensorflowTrainingReplicaSpec{
			kubeflowv1.TFJobReplicaTypeChief:  spec.GetChiefReplicas(),
			kubeflowv1.TFJobReplicaTypeWorker: spec.GetWorkerReplicas(),
			kubeflowv1.TFJobReplicaTypePS:     spec.GetPsReplicas(),
			kubeflowv1.TFJobReplicaTypeEval:   spec.GetEvaluatorReplicas(),
		} {
			if rs != nil {
				fields[t] = fieldsOf(rs)
			}
		}
		var err error
		if rp, err = runPolicy(spec.GetRunPolicy()); err != nil {
			return nil, err
		}
	default:
		return nil, badSpec("tensorflow task: unsupported task type version %d (known: 0, 1)", v)
	}
	for _, t := range tfReplicaTypes {
		if n := fields[t].replicas; n < 0 {
			return nil, badSpec("tensorflow task: %s replicas must not be negative, got %d", t, n)
		}
	}
	if n := fields[kubeflowv1.TFJobReplicaTypeWorker].replicas; n < 1 {
		return nil, badSpec("tensorflow task: workers must be at least 1, got %d", n)
	}
	if n := fields[kubeflowv1.TFJobReplicaTypeChief].replicas; n > 1 {
		return nil, badSpec("tensorflow task: at most one chief, got %d", n)
	}
	specs := map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaSpec{}
	for _, t := range tfReplicaTypes {
		f := fields[t]
		if f.replicas == 0 {
			continue
		}
		rs, err := replicaSpec(pt, f, kubeflowv1.TFJobDefaultContainerName)
		if err != nil {
			return nil, err
		}
		specs[t] = rs
	}
	return &kubeflowv1.TFJob{
		TypeMeta: typeMeta(kubeflowv1.TFJobKind),
		Spec: kubeflowv1.TFJobSpec{TFReplicaSpecs: specs, RunPolicy: rp,
			EnableDynamicWorker: dynamicWorkers(fields)},
	}, nil
}

// dynamicWorkers reports whether the job's workers can come and go: a
// parameter-server job without a chief (worker 0 is the chief, as TF1's
// MonitoredTrainingSession has it). The training operator fails a TFJob as
// soon as one of its pods is deleted (it counts a terminating pod as
// failed) unless enableDynamicWorker is set; then it recreates the pod
// under its name, and gives each worker a sparse TF_CONFIG (the ps and
// itself), which is all a PS worker talks to. A job with a chief keeps the
// full cluster: the operator's sparse TF_CONFIG would leave the chief (TF2's
// coordinator) without the ps' addresses.
func dynamicWorkers(fields map[kubeflowv1.ReplicaType]replicaFields) bool {
	return fields[kubeflowv1.TFJobReplicaTypePS].replicas > 0 && fields[kubeflowv1.TFJobReplicaTypeChief].replicas == 0
}
