package kfoperator

import (
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kfelastic/kfelastic/internal/version"
)

// Where the agent binary and the job token live inside pods.
const (
	// AgentBinaryInImage is the static binary's path in Options.AgentImage,
	// and all the image needs: the init container runs
	// `/kfelastic install AgentBinDir`, the binary copying itself, so the
	// image can be FROM scratch (the repository's Dockerfile, `make image`).
	AgentBinaryInImage = "/kfelastic"
	// AgentBinDir is the emptyDir the init container installs it into; it
	// is mounted at the same path, read-only, in the primary container.
	AgentBinDir = "/kfelastic-bin"
	// AgentBinary is the agent's path in the primary container
	// (`kfelastic install DIR` writes DIR/kfelastic).
	AgentBinary = AgentBinDir + "/kfelastic"
	// TokenDir holds the per-job token Secret (key TokenKey) in the master
	// and in every worker.
	TokenDir  = "/etc/kfelastic"
	TokenKey  = "token"
	TokenFile = TokenDir + "/" + TokenKey
	// MasterPort is the port of the kfelastic master, named as the training
	// operator expects so that it also serves as the job's rendezvous port.
	MasterPort = kubeflowv1.PyTorchJobDefaultPort
	// MasterMetricsPort serves the master's Prometheus metrics.
	MasterMetricsPort = 9090
	// NodeNameEnv carries the pod's node (spec.nodeName) to the agent, which
	// tells the master, so that a relaunch can avoid a faulty machine.
	NodeNameEnv = "KFELASTIC_NODE_NAME"
	// NodeRankEnv carries the worker's replica index (the training
	// operator's replica-index label) to the agent as its node rank. The
	// operator's own PET_NODE_RANK cannot serve: with a Master replica it
	// numbers the workers from 1 (RANK = PET_NODE_RANK = index + 1,
	// training-operator v1.8 setPodEnv), so the last worker of --nnodes N
	// would ask for rank N and be refused.
	NodeRankEnv = "KFELASTIC_NODE_RANK"

	agentVolume    = "kfelastic-bin"
	tokenVolume    = "kfelastic-token"
	initContainer  = "kfelastic-install"
	defaultBackend = "c10d"
)

// MasterStateURL is where an elastic job's master keeps its state: a
// folder next to the task's error documents (the reader lists only
// error*.pb there, so the state never looks like a document).
func MasterStateURL(errorPrefix string) string {
	u, err := url.Parse(errorPrefix)
	if err != nil || u.Scheme == "" {
		return strings.TrimSuffix(errorPrefix, "/") + "/kfelastic-master"
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/kfelastic-master"
	return u.String()
}

// Names of the per-job objects of an elastic job.
func TokenSecretName(job string) string   { return job + "-kfelastic" }
func MasterAccountName(job string) string { return job + "-kfelastic-master" }

// makeElastic turns a built PyTorchJob into an elastic one: ElasticPolicy,
// gang-scheduling minimum, the agent around the workers' command and a
// kfelastic master as the Master replica.
func makeElastic(job *kubeflowv1.PyTorchJob, ec elasticConfig, opts Options) error {
	min, max := ec.GetMinReplicas(), ec.GetMaxReplicas()
	switch {
	case min < 1:
		return badSpec("elastic config: min_replicas must be at least 1, got %d", min)
	case max < min:
		return badSpec("elastic config: max_replicas (%d) is less than min_replicas (%d)", max, min)
	case ec.GetNprocPerNode() < 1:
		return badSpec("elastic config: nproc_per_node must be at least 1, got %d", ec.GetNprocPerNode())
	case ec.GetMaxRestarts() < 0:
		return badSpec("elastic config: max_restarts must not be negative, got %d", ec.GetMaxRestarts())
	case opts.Name == "" || opts.Namespace == "":
		return badSpec("elastic pytorch task: job name and namespace are needed to address the master")
	}
	backend := ec.GetRdzvBackend()
	if backend == "" {
		backend = opts.RDZVBackend
	}
	if backend == "" {
		backend = defaultBackend
	}
	worker := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker]
	if n := *worker.Replicas; n < min || n > max {
		return badSpec("elastic config: %d worker replicas outside [min_replicas, max_replicas] = [%d, %d]", n, min, max)
	}

	if opts.AgentImage == "" {
		opts.AgentImage = DefaultAgentImage()
	}
	nproc, restarts := ec.GetNprocPerNode(), ec.GetMaxRestarts()
	rdzvBackend := kubeflowv1.RDZVBackend(backend)
	host := opts.Name + "-master-0"
	port := int32(MasterPort)
	job.Spec.ElasticPolicy = &kubeflowv1.ElasticPolicy{
		MinReplicas:  &min,
		MaxReplicas:  &max,
		RDZVBackend:  &rdzvBackend,
		RDZVHost:     &host,
		RDZVPort:     &port,
		NProcPerNode: &nproc,
		MaxRestarts:  &restarts,
	}
	// Gang scheduling: the master and the minimum number of workers must
	// start together, or nobody can make progress.
	gang := min + 1
	if job.Spec.RunPolicy.SchedulingPolicy == nil {
		job.Spec.RunPolicy.SchedulingPolicy = &kubeflowv1.SchedulingPolicy{}
	}
	job.Spec.RunPolicy.SchedulingPolicy.MinAvailable = &gang

	// The agent's exit codes fit the ExitCode policy (≥128: node-level and
	// retryable, the operator replaces the pod; 1: user error, final). A
	// template that asked for Never (the proto default) gets that.
	if worker.RestartPolicy == kubeflowv1.RestartPolicyNever {
		worker.RestartPolicy = kubeflowv1.RestartPolicyExitCode
	}
	c, err := containerNamed(&worker.Template.Spec, kubeflowv1.PyTorchJobDefaultContainerName)
	if err != nil {
		return err
	}
	launcher := LauncherOf(append(append([]string{}, c.Command...), c.Args...))
	agentArgs := []string{
		"agent",
		"--launcher", launcher,
		"--error-prefix", opts.ErrorPrefix,
		"--nnodes", fmt.Sprintf("%d:%d", min, max),
	}
	if launcher == LauncherAgent {
		agentArgs = append(agentArgs,
			"--nproc-per-node", strconv.Itoa(int(nproc)),
			"--max-restarts", strconv.Itoa(int(restarts)))
	} else {
		// torch's elastic_launch inside the command starts the
		// nproc_per_node workers and spends the ElasticConfig's restart
		// budget (flytekit passes both to its LaunchConfig). The agent
		// starts the one command and must not restart it on top of that:
		// 0, given explicitly, because the operator's PET_MAX_RESTARTS
		// (the same budget) would otherwise become the agent's default.
		// PET_NPROC_PER_NODE and the other PET_* stay as the operator
		// sets them, for the command.
		agentArgs = append(agentArgs, "--max-restarts", "0")
	}
	agentArgs = append(agentArgs,
		"--rdzv-endpoint", fmt.Sprintf("%s:%d", host, port),
		"--rdzv-id", opts.Name,
		"--token-file", TokenFile,
	)
	if opts.NetworkCheck {
		agentArgs = append(agentArgs, "--network-check")
	}
	if opts.ExcludeStraggler {
		agentArgs = append(agentArgs, "--exclude-straggler")
	}
	if opts.HangTimeoutSec > 0 {
		agentArgs = append(agentArgs, "--hang-timeout", fmt.Sprintf("%ds", opts.HangTimeoutSec))
	}
	if err := injectAgent(&worker.Template.Spec, c, opts.AgentImage, agentArgs, opts.Name); err != nil {
		return err
	}
	job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeMaster] = masterReplica(job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeMaster], worker, min, max, opts)
	return nil
}

// Launchers of `kfelastic agent --launcher` (docs/DESIGN.md §4.4).
const (
	// LauncherAgent: the agent starts --nproc-per-node workers itself.
	LauncherAgent = "agent"
	// LauncherCommand: the command starts its own workers through torch
	// elastic; the agent starts it once and relays torch's store.
	LauncherCommand = "command"
)

// flytekitEntrypoints are the commands every flytekit task runs in its
// container (python_auto_container's default command, and the prefix of
// fast registration). An Elastic task's pyflyte-execute calls torch's
// elastic_launch itself, with the task function as the workers, so no
// outside launcher can take its place.
var flytekitEntrypoints = map[string]bool{"pyflyte-execute": true, "pyflyte-fast-execute": true}

// LauncherOf is the agent launcher for a container's command line
// (Command then Args): LauncherCommand when it runs pyflyte-execute or
// pyflyte-fast-execute (by name or path), LauncherAgent for anything else.
func LauncherOf(argv []string) string {
	if len(argv) > 0 && flytekitEntrypoints[path.Base(argv[0])] {
		return LauncherCommand
	}
	return LauncherAgent
}

// DefaultAgentImage is the image an elastic job uses when Options.AgentImage
// is empty: the one published for this build's version
// (ghcr.io/kfelastic/kfelastic:<version>), so that the agent and master in
// the pods match the plugin that built them.
func DefaultAgentImage() string { return version.Image() }

func containerNamed(spec *corev1.PodSpec, name string) (*corev1.Container, error) {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i], nil
		}
	}
	return nil, badSpec("no container %q to wrap with the agent", name)
}

// injectAgent adds the init container that installs the agent and wraps the
// primary container c of spec: Command+Args become the agent's arguments
// after "--". A container with no Command relied on the image's entrypoint,
// which cannot be known here; its Args are run as the command (flytekit's
// images put pyflyte-execute in Args).
func injectAgent(spec *corev1.PodSpec, c *corev1.Container, image string, agentArgs []string, job string) error {
	original := append(append([]string{}, c.Command...), c.Args...)
	if len(original) == 0 {
		return badSpec("elastic pytorch task: the container has neither command nor args to run under the agent")
	}
	c.Command = []string{AgentBinary}
	c.Env = append(c.Env,
		corev1.EnvVar{Name: NodeNameEnv, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		corev1.EnvVar{Name: NodeRankEnv, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['" + kubeflowv1.ReplicaIndexLabel + "']"}}},
	)
	c.Args = append(append(append([]string{}, agentArgs...), "--"), original...)
	c.VolumeMounts = append(c.VolumeMounts,
		corev1.VolumeMount{Name: agentVolume, MountPath: AgentBinDir, ReadOnly: true},
		corev1.VolumeMount{Name: tokenVolume, MountPath: TokenDir, ReadOnly: true},
	)
	spec.InitContainers = append(spec.InitContainers, corev1.Container{
		Name:  initContainer,
		Image: image,
		// The binary copies itself: nothing else is needed in the image.
		Command:      []string{AgentBinaryInImage, "install", AgentBinDir},
		VolumeMounts: []corev1.VolumeMount{{Name: agentVolume, MountPath: AgentBinDir}},
		Resources:    smallResources(),
	})
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: agentVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		tokenVolumeOf(job),
	)
	return nil
}

func tokenVolumeOf(job string) corev1.Volume {
	return corev1.Volume{Name: tokenVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: TokenSecretName(job),
	}}}
}

// smallResources is what the installer and the master ask for: they copy a
// file, or keep a few kilobytes of state per node.
func smallResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("512Mi")},
	}
}

// masterReplica is the Master replica of an elastic job: one pod running
// `kfelastic master` from the agent image, under the job's service account,
// placed like the workers (node selector, tolerations, pull secrets) and
// labelled like the task's pods.
func masterReplica(flyteMaster, worker *kubeflowv1.ReplicaSpec, min, max int32, opts Options) *kubeflowv1.ReplicaSpec {
	meta := *worker.Template.ObjectMeta.DeepCopy()
	if flyteMaster != nil {
		meta = *flyteMaster.Template.ObjectMeta.DeepCopy()
	}
	args := []string{
		"master",
		"--rdzv-id", opts.Name,
		"--listen", fmt.Sprintf(":%d", MasterPort),
		"--nnodes", fmt.Sprintf("%d:%d", min, max),
		// The pods the operator starts: once they all wait, the first round
		// need not wait out the last call for a node that is not coming.
		"--expected-nodes", strconv.Itoa(int(*worker.Replicas)),
		"--token-file", TokenFile,
		"--state", MasterStateURL(opts.ErrorPrefix),
		"--error-prefix", opts.ErrorPrefix,
		"--kube-namespace", opts.Namespace,
		"--kube-job", opts.Name,
		"--metrics-listen", fmt.Sprintf(":%d", MasterMetricsPort),
	}
	if opts.OOMFactor > 0 {
		args = append(args, "--oom-factor", strconv.FormatFloat(opts.OOMFactor, 'g', -1, 64))
	}
	if opts.OOMMaxIncrement != "" {
		args = append(args, "--oom-max-increment", opts.OOMMaxIncrement)
	}
	if opts.OOMMaxMemory != "" {
		args = append(args, "--oom-max-memory", opts.OOMMaxMemory)
	}
	if opts.MaxRelaunches > 0 {
		args = append(args, "--max-relaunches", strconv.Itoa(opts.MaxRelaunches))
	}
	if opts.NetworkCheck {
		args = append(args, "--network-check")
	}
	if opts.ExcludeStraggler {
		args = append(args, "--exclude-straggler")
	}
	if opts.TaintFailedNodes {
		args = append(args, "--taint-failed-nodes")
	}
	c := corev1.Container{
		Name:    kubeflowv1.PyTorchJobDefaultContainerName,
		Image:   opts.AgentImage,
		Command: []string{AgentBinaryInImage},
		Args:    args,
		Ports: []corev1.ContainerPort{
			{Name: kubeflowv1.PyTorchJobDefaultPortName, ContainerPort: MasterPort, Protocol: corev1.ProtocolTCP},
			{Name: "metrics", ContainerPort: MasterMetricsPort, Protocol: corev1.ProtocolTCP},
		},
		Resources: smallResources(),
		VolumeMounts: []corev1.VolumeMount{
			{Name: tokenVolume, MountPath: TokenDir, ReadOnly: true},
		},
	}
	addErrorPropagationEnv(&c)
	inheritStorageEnv(&c, &worker.Template.Spec)
	ws := worker.Template.Spec
	one := int32(1)
	return &kubeflowv1.ReplicaSpec{
		Replicas:      &one,
		RestartPolicy: kubeflowv1.RestartPolicyOnFailure,
		Template: corev1.PodTemplateSpec{
			ObjectMeta: meta,
			Spec: corev1.PodSpec{
				Containers:         []corev1.Container{c},
				Volumes:            []corev1.Volume{tokenVolumeOf(opts.Name)},
				ServiceAccountName: MasterAccountName(opts.Name),
				NodeSelector:       ws.NodeSelector,
				Tolerations:        ws.Tolerations,
				ImagePullSecrets:   ws.ImagePullSecrets,
				PriorityClassName:  ws.PriorityClassName,
				SchedulerName:      ws.SchedulerName,
			},
		},
	}
}

// inheritStorageEnv gives the master container the worker's environment
// (Env and EnvFrom, but for what the agent's injection added): the master
// reads and writes the task's prefix (its durable state, the documents of
// pods that died without one) with the workers' storage credentials, which
// a Flyte deployment puts there (propeller's default-env-vars, secrets).
// Without them it cannot start on a store that needs credentials.
func inheritStorageEnv(c *corev1.Container, worker *corev1.PodSpec) {
	w, err := containerNamed(worker, kubeflowv1.PyTorchJobDefaultContainerName)
	if err != nil {
		return
	}
	have := map[string]bool{NodeNameEnv: true, NodeRankEnv: true}
	for _, e := range c.Env {
		have[e.Name] = true
	}
	for _, e := range w.Env {
		if !have[e.Name] {
			have[e.Name] = true
			c.Env = append(c.Env, *e.DeepCopy())
		}
	}
	for _, e := range w.EnvFrom {
		c.EnvFrom = append(c.EnvFrom, *e.DeepCopy())
	}
}

// MasterObjects are the objects an elastic job's master needs, to be created
// before the job: the token Secret (token chosen by the caller, so that this
// stays pure), a service account, and a Role bound to it that allows exactly
// what carrying out relaunch decisions takes — read and patch this job (to
// raise a replica template's memory after an OOM) and read and delete its
// pods (so that the operator recreates them). owner, when set, makes them
// garbage-collected with the Flyte workflow that owns the job.
func MasterObjects(job, namespace, token string, owner *metav1.OwnerReference, labels map[string]string) []client.Object {
	meta := func(name string) metav1.ObjectMeta {
		m := metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{}}
		for k, v := range labels {
			m.Labels[k] = v
		}
		m.Labels[kubeflowv1.JobNameLabel] = job
		if owner != nil {
			m.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return m
	}
	account := MasterAccountName(job)
	secret := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{Kind: "Secret", APIVersion: "v1"},
		ObjectMeta: meta(TokenSecretName(job)),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{TokenKey: []byte(token)},
	}
	sa := &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{Kind: "ServiceAccount", APIVersion: "v1"},
		ObjectMeta: meta(account),
	}
	role := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{Kind: "Role", APIVersion: rbacv1.SchemeGroupVersion.String()},
		ObjectMeta: meta(account),
		Rules: []rbacv1.PolicyRule{
			{
				APIGroups:     []string{kubeflowv1.GroupVersion.Group},
				Resources:     []string{kubeflowv1.PyTorchJobPlural},
				ResourceNames: []string{job},
				Verbs:         []string{"get", "patch", "update"},
			},
			{
				// list/watch cannot be narrowed by name; the master filters
				// by the job-name label.
				APIGroups: []string{""},
				Resources: []string{"pods"},
				Verbs:     []string{"get", "list", "watch", "delete"},
			},
			{
				// The GPU health daemons' Warning events on the job's pods
				// (GPUXidError, GPUSXidError).
				APIGroups: []string{""},
				Resources: []string{"events"},
				Verbs:     []string{"list", "watch"},
			},
		},
	}
	binding := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{Kind: "RoleBinding", APIVersion: rbacv1.SchemeGroupVersion.String()},
		ObjectMeta: meta(account),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: account},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: account, Namespace: namespace}},
	}
	return []client.Object{secret, sa, role, binding}
}

// IsElastic reports whether a PyTorchJob was built with the agent.
func IsElastic(job *kubeflowv1.PyTorchJob) bool {
	w := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker]
	if w == nil {
		return false
	}
	for _, c := range w.Template.Spec.InitContainers {
		if c.Name == initContainer {
			return true
		}
	}
	return false
}
