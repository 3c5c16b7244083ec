package kfoperator

import (
	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/plugins"
	kfplugins "github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/plugins/kubeflow"
	flyteerr "github.com/flyteorg/flyte/flyteplugins/go/tasks/errors"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Task types this package builds for (flytekit's names).
const (
	PyTorchTaskType    = "pytorch"
	TensorflowTaskType = "tensorflow"
)

// PodTemplater renders the pod template of one replica from the task's
// container: what flytek8s.ToK8sPodSpec gives (env, inputs/outputs, platform
// resources, tolerations, labels, annotations), with resources replaced by
// the replica's own when res is non-nil. It returns the template and the name
// of the primary container in it. The plugin implements it over the
// TaskExecutionContext; tests implement it with a fixed pod.
type PodTemplater interface {
	PodTemplate(res *core.Resources) (corev1.PodTemplateSpec, string, error)
}

// Options are what a builder needs besides the template: the job's identity
// (the plugin manager names the object after the task execution, so the
// builder knows the name in advance) and the agent settings.
type Options struct {
	Name      string
	Namespace string
	// ErrorPrefix is the gocloud.dev URL of the task's output prefix, where
	// agents write error documents (see ErrorPrefixURL).
	ErrorPrefix string
	// AgentImage holds the static kfelastic binary at /kfelastic (nothing
	// else is needed); empty means DefaultAgentImage, the image published
	// for this build's version.
	AgentImage string
	// RDZVBackend is used when the ElasticConfig leaves it empty.
	RDZVBackend string
	// Agent flags the operator chooses for every elastic task.
	NetworkCheck     bool
	ExcludeStraggler bool
	HangTimeoutSec   int
	// Relaunch policy passed to the master (docs/DESIGN.md §5.5).
	OOMFactor       float64
	OOMMaxIncrement string
	OOMMaxMemory    string
	MaxRelaunches   int
	// TaintFailedNodes: the master taints the nodes it relaunches pods
	// away from (master --taint-failed-nodes).
	TaintFailedNodes bool
}

// badSpec is the error every builder returns for a template it refuses;
// flytepropeller turns it into a permanent failure before anything reaches
// the API server.
func badSpec(format string, args ...any) error {
	return flyteerr.Errorf(flyteerr.BadTaskSpecification, format, args...)
}

// replicaSource is what the v1 replica specs of both frameworks share.
type replicaSource interface {
	GetReplicas() int32
	GetImage() string
	GetResources() *core.Resources
	GetRestartPolicy() plugins.RestartPolicy
	GetCommon() *plugins.CommonReplicaSpec
}

// replicaFields reads a v1 replica spec, preferring the CommonReplicaSpec
// over the deprecated top-level fields as flytekit ≥1.10 writes it.
type replicaFields struct {
	replicas  int32
	image     string
	resources *core.Resources
	restart   plugins.RestartPolicy
}

func fieldsOf(rs replicaSource) replicaFields {
	if c := rs.GetCommon(); c != nil {
		return replicaFields{c.GetReplicas(), c.GetImage(), c.GetResources(), c.GetRestartPolicy()}
	}
	return replicaFields{rs.GetReplicas(), rs.GetImage(), rs.GetResources(), rs.GetRestartPolicy()}
}

// replicaSpec renders one replica: the pod from the templater with the
// primary container renamed to what the operator requires, the image
// overridden, the Flyte error-propagation env added.
func replicaSpec(pt PodTemplater, f replicaFields, containerName string) (*kubeflowv1.ReplicaSpec, error) {
	tmpl, primary, err := pt.PodTemplate(f.resources)
	if err != nil {
		return nil, badSpec("unable to create pod spec: %v", err)
	}
	idx := -1
	for i := range tmpl.Spec.Containers {
		if tmpl.Spec.Containers[i].Name == primary {
			idx = i
			break
		}
	}
	if idx < 0 {
		return nil, badSpec("pod spec has no primary container %q", primary)
	}
	c := &tmpl.Spec.Containers[idx]
	c.Name = containerName
	if f.image != "" {
		c.Image = f.image
	}
	addErrorPropagationEnv(c)
	replicas := f.replicas
	return &kubeflowv1.ReplicaSpec{
		Replicas:      &replicas,
		Template:      tmpl,
		RestartPolicy: restartPolicy(f.restart),
	}, nil
}

// Env vars that switch on flytekit's per-pod error documents (docs/DESIGN.md §2.3).
const (
	EnvWorkerName        = "_F_WN"
	EnvDistErrorStrategy = "_F_DES"
	// EarliestStrategy is flyteplugins' EarliestErrorAggregationStrategy.String().
	EarliestStrategy = "Earliest"
)

// addErrorPropagationEnv sets _F_WN (the pod name, through the downward API)
// and _F_DES=Earliest on a container, replacing values the template may
// already carry so that each appears once.
func addErrorPropagationEnv(c *corev1.Container) {
	setEnv(c, corev1.EnvVar{Name: EnvWorkerName, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"},
	}})
	setEnv(c, corev1.EnvVar{Name: EnvDistErrorStrategy, Value: EarliestStrategy})
}

func setEnv(c *corev1.Container, v corev1.EnvVar) {
	for i := range c.Env {
		if c.Env[i].Name == v.Name {
			c.Env[i] = v
			return
		}
	}
	c.Env = append(c.Env, v)
}

// restartPolicy maps flyteidl's restart policy; NEVER is the proto's zero.
func restartPolicy(p plugins.RestartPolicy) kubeflowv1.RestartPolicy {
	switch p {
	case plugins.RestartPolicy_RESTART_POLICY_ON_FAILURE:
		return kubeflowv1.RestartPolicyOnFailure
	case plugins.RestartPolicy_RESTART_POLICY_ALWAYS:
		return kubeflowv1.RestartPolicyAlways
	default:
		return kubeflowv1.RestartPolicyNever
	}
}

// runPolicy maps flyteidl's RunPolicy as upstream does: zero values mean
// "unset", the clean-pod policy is always set.
func runPolicy(rp *kfplugins.RunPolicy) (kubeflowv1.RunPolicy, error) {
	out := kubeflowv1.RunPolicy{}
	if rp == nil {
		return out, nil
	}
	if rp.GetBackoffLimit() < 0 || rp.GetActiveDeadlineSeconds() < 0 || rp.GetTtlSecondsAfterFinished() < 0 {
		return out, badSpec("run policy: backoff_limit, active_deadline_seconds and ttl_seconds_after_finished must not be negative")
	}
	if v := rp.GetBackoffLimit(); v != 0 {
		out.BackoffLimit = &v
	}
	var clean kubeflowv1.CleanPodPolicy
	switch rp.GetCleanPodPolicy() {
	case kfplugins.CleanPodPolicy_CLEANPOD_POLICY_ALL:
		clean = kubeflowv1.CleanPodPolicyAll
	case kfplugins.CleanPodPolicy_CLEANPOD_POLICY_RUNNING:
		clean = kubeflowv1.CleanPodPolicyRunning
	case kfplugins.CleanPodPolicy_CLEANPOD_POLICY_NONE:
		clean = kubeflowv1.CleanPodPolicyNone
	default:
		return out, badSpec("run policy: unknown clean_pod_policy %v", rp.GetCleanPodPolicy())
	}
	out.CleanPodPolicy = &clean
	if v := rp.GetActiveDeadlineSeconds(); v != 0 {
		d := int64(v)
		out.ActiveDeadlineSeconds = &d
	}
	if v := rp.GetTtlSecondsAfterFinished(); v != 0 {
		out.TTLSecondsAfterFinished = &v
	}
	return out, nil
}

// readTemplate checks the parts every builder needs.
func readTemplate(tmpl *core.TaskTemplate, taskType string) error {
	if tmpl == nil {
		return badSpec("nil task template")
	}
	if tmpl.GetType() != taskType && tmpl.GetType() != "" {
		// flytekit sets the type; upstream's tests leave "container". Only
		// a template of the other framework is refused.
		other := map[string]string{PyTorchTaskType: TensorflowTaskType, TensorflowTaskType: PyTorchTaskType}[taskType]
		if tmpl.GetType() == other {
			return badSpec("task type %q given to the %s builder", tmpl.GetType(), taskType)
		}
	}
	if tmpl.GetCustom() == nil {
		return badSpec("%s task template has no custom field (the distributed training spec)", taskType)
	}
	return nil
}

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{Kind: kind, APIVersion: kubeflowv1.SchemeGroupVersion.String()}
}
