package kfoperator

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/flytek8s"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/utils"
	flyteerrs "github.com/flyteorg/flyte/flytestdlib/errors"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kfelastic/kfelastic/internal/test/flytetest"
	"github.com/kfelastic/kfelastic/internal/version"
)

// fixedPods renders the template's container the simple way: name
// "primary", image, args and env from the template, resources converted; a
// K8sPod template (flytekit's, with a pod template) as its pod spec, with
// the primary container its config names.
// (The plugin renders both with flytek8s; its tests compare with upstream.)
type fixedPods struct{ tmpl *core.TaskTemplate }

func (f fixedPods) PodTemplate(res *core.Resources) (corev1.PodTemplateSpec, string, error) {
	meta := metav1.ObjectMeta{Labels: map[string]string{"flyte": "yes"}}
	if pod := f.tmpl.GetK8SPod(); pod != nil {
		var spec corev1.PodSpec
		if err := utils.UnmarshalStructToObj(pod.GetPodSpec(), &spec); err != nil {
			return corev1.PodTemplateSpec{}, "", err
		}
		spec.RestartPolicy = corev1.RestartPolicyNever
		return corev1.PodTemplateSpec{ObjectMeta: meta, Spec: spec}, f.tmpl.GetConfig()["primary_container_name"], nil
	}
	c := f.tmpl.GetContainer()
	ctr := corev1.Container{Name: "primary", Image: c.GetImage(), Args: slices.Clone(c.GetArgs())}
	for _, kv := range c.GetEnv() {
		ctr.Env = append(ctr.Env, corev1.EnvVar{Name: kv.GetKey(), Value: kv.GetValue()})
	}
	if res != nil {
		r, err := flytek8s.ToK8sResourceRequirements(res)
		if err != nil {
			return corev1.PodTemplateSpec{}, "", err
		}
		ctr.Resources = *r
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: meta,
		Spec:       corev1.PodSpec{Containers: []corev1.Container{ctr}, RestartPolicy: corev1.RestartPolicyNever},
	}, "primary", nil
}

var testOpts = Options{
	Name: "job1", Namespace: "ns1", ErrorPrefix: "s3://bucket/metadata/outputs/0",
	AgentImage: "ghcr.io/kfelastic/kfelastic:test", OOMFactor: 2, OOMMaxIncrement: "8Gi", OOMMaxMemory: "64Gi",
}

// optsFor are the options a table entry is built with: testOpts, without
// an agent image for the entries that check the default one.
func optsFor(w want) Options {
	o := testOpts
	if w.defaultImage {
		o.AgentImage = ""
	}
	return o
}

// build dispatches on the template's type as the plugin does.
func build(tmpl *core.TaskTemplate, opts Options) (specs map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaSpec, rp kubeflowv1.RunPolicy, ep *kubeflowv1.ElasticPolicy, err error) {
	if tmpl.GetType() == TensorflowTaskType {
		j, err := BuildTFJob(tmpl, fixedPods{tmpl}, opts)
		if err != nil {
			return nil, rp, nil, err
		}
		return j.Spec.TFReplicaSpecs, j.Spec.RunPolicy, nil, nil
	}
	j, err := BuildPyTorchJob(tmpl, fixedPods{tmpl}, opts)
	if err != nil {
		return nil, rp, nil, err
	}
	return j.Spec.PyTorchReplicaSpecs, j.Spec.RunPolicy, j.Spec.ElasticPolicy, nil
}

func replicas(rs *kubeflowv1.ReplicaSpec) int32 {
	if rs == nil || rs.Replicas == nil {
		return -1
	}
	return *rs.Replicas
}

func container(rs *kubeflowv1.ReplicaSpec, name string) *corev1.Container {
	for i := range rs.Template.Spec.Containers {
		if rs.Template.Spec.Containers[i].Name == name {
			return &rs.Template.Spec.Containers[i]
		}
	}
	return nil
}

// want is the table's expectation for one template.
type want struct {
	err      string // substring of the BadTaskSpecification error
	replicas map[kubeflowv1.ReplicaType]int32
	images   map[kubeflowv1.ReplicaType]string
	restart  map[kubeflowv1.ReplicaType]kubeflowv1.RestartPolicy
	memLimit map[kubeflowv1.ReplicaType]string
	elastic  *[4]int32 // min, max, nproc, maxRestarts
	rp       func(t *testing.T, rp kubeflowv1.RunPolicy)
	// Elastic entries: the wrapped command (default "test-args"), whether
	// the agent runs it with --launcher command (flytekit's entrypoints),
	// and whether the job is built without an agent image (the default).
	command      string
	commandMode  bool
	defaultImage bool
}

const (
	M  = kubeflowv1.PyTorchJobReplicaTypeMaster
	W  = kubeflowv1.PyTorchJobReplicaTypeWorker
	C  = kubeflowv1.TFJobReplicaTypeChief
	PS = kubeflowv1.TFJobReplicaTypePS
	E  = kubeflowv1.TFJobReplicaTypeEval
)

var table = map[string]want{
	"upstream-pytorch-v0": {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 100}, images: map[kubeflowv1.ReplicaType]string{M: "image://", W: "image://"},
		restart: map[kubeflowv1.ReplicaType]kubeflowv1.RestartPolicy{M: "Never", W: "Never"}},
	"upstream-pytorch-v0-elastic": {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 2}, elastic: &[4]int32{1, 2, 4, 0},
		images: map[kubeflowv1.ReplicaType]string{M: testOpts.AgentImage, W: "image://"}, restart: map[kubeflowv1.ReplicaType]kubeflowv1.RestartPolicy{M: "OnFailure", W: "ExitCode"}},
	"upstream-pytorch-v1": {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 100}, images: map[kubeflowv1.ReplicaType]string{M: "image://master", W: "image://"},
		restart: map[kubeflowv1.ReplicaType]kubeflowv1.RestartPolicy{M: "Always", W: "Never"}, memLimit: map[kubeflowv1.ReplicaType]string{M: "500Mi", W: "2Gi"}},
	"upstream-pytorch-v1-common": {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 100}, images: map[kubeflowv1.ReplicaType]string{M: "image://master", W: "image://"},
		restart: map[kubeflowv1.ReplicaType]kubeflowv1.RestartPolicy{M: "Always", W: "Never"}, memLimit: map[kubeflowv1.ReplicaType]string{M: "500Mi", W: "2Gi"}},
	"upstream-pytorch-v1-runpolicy": {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 100}, rp: func(t *testing.T, rp kubeflowv1.RunPolicy) {
		if *rp.CleanPodPolicy != kubeflowv1.CleanPodPolicyAll || *rp.BackoffLimit != 100 || *rp.ActiveDeadlineSeconds != 1000 || *rp.TTLSecondsAfterFinished != 10000 {
			t.Errorf("run policy %+v", rp)
		}
	}},
	"upstream-pytorch-v1-only-worker": {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 100}, images: map[kubeflowv1.ReplicaType]string{M: "image://", W: "image://worker"},
		memLimit: map[kubeflowv1.ReplicaType]string{W: "2Gi"}},
	"upstream-pytorch-v1-elastic": {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 2}, elastic: &[4]int32{1, 2, 4, 3}},
	"upstream-tensorflow-v0":      {replicas: map[kubeflowv1.ReplicaType]int32{C: 1, W: 100, PS: 50, E: 1}},
	"upstream-tensorflow-v1": {replicas: map[kubeflowv1.ReplicaType]int32{C: 1, W: 100, PS: 50, E: 1},
		restart:  map[kubeflowv1.ReplicaType]kubeflowv1.RestartPolicy{C: "Always", W: "Never", PS: "Never", E: "Always"},
		memLimit: map[kubeflowv1.ReplicaType]string{C: "2Gi", W: "2Gi", PS: "2Gi", E: "2Gi"},
		rp: func(t *testing.T, rp kubeflowv1.RunPolicy) {
			if *rp.CleanPodPolicy != kubeflowv1.CleanPodPolicyRunning || *rp.BackoffLimit != 5 || *rp.ActiveDeadlineSeconds != 3600 || rp.TTLSecondsAfterFinished != nil {
				t.Errorf("run policy %+v", rp)
			}
		}},
	"upstream-tensorflow-v1-only-worker": {replicas: map[kubeflowv1.ReplicaType]int32{W: 100}, images: map[kubeflowv1.ReplicaType]string{W: "image://worker"}},
	"pytorch-v1-elastic-3-4": {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 4}, elastic: &[4]int32{3, 4, 2, 5},
		images:  map[kubeflowv1.ReplicaType]string{M: testOpts.AgentImage, W: "image://trainer"},
		restart: map[kubeflowv1.ReplicaType]kubeflowv1.RestartPolicy{M: "OnFailure", W: "OnFailure"}, memLimit: map[kubeflowv1.ReplicaType]string{W: "8Gi"},
		rp: func(t *testing.T, rp kubeflowv1.RunPolicy) {
			if *rp.BackoffLimit != 3 || rp.SchedulingPolicy == nil || *rp.SchedulingPolicy.MinAvailable != 4 {
				t.Errorf("run policy %+v (want gang minimum 3 workers + master)", rp)
			}
		}},
	// flytekit's Elastic(nnodes="2:4", nproc_per_node=2, max_restarts=3),
	// with the /dev/shm pod template flytekit adds by default, and
	// Elastic(nnodes="1:2", nproc_per_node=4) fast-registered: both run
	// under the agent's command launcher, with the default agent image.
	"flytekit-elastic-pyflyte-execute": {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 4}, elastic: &[4]int32{2, 4, 2, 3},
		images:  map[kubeflowv1.ReplicaType]string{M: DefaultAgentImage(), W: "ghcr.io/example/trainer:v1"},
		restart: map[kubeflowv1.ReplicaType]kubeflowv1.RestartPolicy{M: "OnFailure", W: "ExitCode"}, memLimit: map[kubeflowv1.ReplicaType]string{W: "8Gi"},
		command: "pyflyte-execute --inputs {{.input}}", commandMode: true, defaultImage: true},
	"flytekit-elastic-fast-execute": {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 2}, elastic: &[4]int32{1, 2, 4, 0},
		images:  map[kubeflowv1.ReplicaType]string{M: DefaultAgentImage(), W: "ghcr.io/example/trainer:v1"},
		command: "pyflyte-fast-execute --additional-distribution s3://", commandMode: true, defaultImage: true},
	"pytorch-v1-two-workers":    {replicas: map[kubeflowv1.ReplicaType]int32{M: 1, W: 2}, images: map[kubeflowv1.ReplicaType]string{M: "trainer:1", W: "trainer:1"}},
	"tensorflow-v1-ps":          {replicas: map[kubeflowv1.ReplicaType]int32{C: 1, W: 2, PS: 1}},
	"tensorflow-v1-ps-no-chief": {replicas: map[kubeflowv1.ReplicaType]int32{W: 3, PS: 1}},

	"bad-pytorch-version-2":                  {err: "unsupported task type version 2"},
	"bad-pytorch-v0-zero-workers":            {err: "workers must be at least 1, got 0"},
	"bad-pytorch-v1-zero-workers":            {err: "worker replicas must be at least 1, got 0"},
	"bad-pytorch-v1-no-workers":              {err: "worker_replicas is missing"},
	"bad-pytorch-v1-elastic-min-gt-max":      {err: "max_replicas (2) is less than min_replicas (3)"},
	"bad-pytorch-v1-elastic-min-zero":        {err: "min_replicas must be at least 1"},
	"bad-pytorch-v1-elastic-nproc-zero":      {err: "nproc_per_node must be at least 1"},
	"bad-pytorch-v1-elastic-workers-outside": {err: "5 worker replicas outside [min_replicas, max_replicas] = [1, 2]"},
	"bad-pytorch-v1-negative-runpolicy":      {err: "must not be negative"},
	"bad-pytorch-v0-wrong-field-type":        {err: "invalid pytorch v0 task spec"},
	"bad-tensorflow-version-3":               {err: "unsupported task type version 3"},
	"bad-tensorflow-v0-zero-workers":         {err: "workers must be at least 1, got 0"},
	"bad-tensorflow-v1-two-chiefs":           {err: "at most one chief, got 2"},
	"bad-tensorflow-v1-negative-ps":          {err: "PS replicas must not be negative"},
}

func TestBuildTable(t *testing.T) {
	for _, name := range flytetest.TemplateNames(t, "") {
		if _, ok := table[name]; !ok {
			t.Errorf("testdata/tasks/%s.json has no expectation in the table", name)
		}
	}
	for name, w := range table {
		t.Run(name, func(t *testing.T) {
			tmpl := flytetest.LoadTemplate(t, name)
			specs, rp, ep, err := build(tmpl, optsFor(w))
			if w.err != "" {
				if err == nil {
					t.Fatalf("built a job, want error %q", w.err)
				}
				if code, ok := flyteerrs.GetErrorCode(err); !ok || code != "BadTaskSpecification" {
					t.Errorf("error code %v, want BadTaskSpecification (%v)", code, err)
				}
				if !strings.Contains(err.Error(), w.err) {
					t.Errorf("error %q, want it to say %q", err, w.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(specs) != len(w.replicas) {
				t.Errorf("replica types %v, want %v", keys(specs), w.replicas)
			}
			name := map[bool]string{true: kubeflowv1.TFJobDefaultContainerName, false: kubeflowv1.PyTorchJobDefaultContainerName}[tmpl.GetType() == TensorflowTaskType]
			for rt, n := range w.replicas {
				rs := specs[rt]
				if got := replicas(rs); got != n {
					t.Errorf("%s replicas %d, want %d", rt, got, n)
					continue
				}
				c := container(rs, name)
				if c == nil {
					t.Errorf("%s has no container %q", rt, name)
					continue
				}
				// Error propagation on every replica type.
				if !hasEnv(c, EnvWorkerName, "", "metadata.name") || !hasEnv(c, EnvDistErrorStrategy, "Earliest", "") {
					t.Errorf("%s container env %v lacks _F_WN (downward API) or _F_DES=Earliest", rt, c.Env)
				}
				if img, ok := w.images[rt]; ok && c.Image != img {
					t.Errorf("%s image %q, want %q", rt, c.Image, img)
				}
				if rpol, ok := w.restart[rt]; ok && rs.RestartPolicy != rpol {
					t.Errorf("%s restart policy %q, want %q", rt, rs.RestartPolicy, rpol)
				}
				if m, ok := w.memLimit[rt]; ok {
					if got := c.Resources.Limits[corev1.ResourceMemory]; got.Cmp(resource.MustParse(m)) != 0 {
						t.Errorf("%s memory limit %s, want %s", rt, got.String(), m)
					}
				}
			}
			if w.rp != nil {
				w.rp(t, rp)
			}
			if (ep != nil) != (w.elastic != nil) {
				t.Fatalf("elastic policy %+v, want %v", ep, w.elastic)
			}
			if ep != nil {
				e := w.elastic
				if *ep.MinReplicas != e[0] || *ep.MaxReplicas != e[1] || *ep.NProcPerNode != e[2] || *ep.MaxRestarts != e[3] || *ep.RDZVBackend != "c10d" {
					t.Errorf("elastic policy min %d max %d nproc %d restarts %d backend %s, want %v", *ep.MinReplicas, *ep.MaxReplicas, *ep.NProcPerNode, *ep.MaxRestarts, *ep.RDZVBackend, *e)
				}
				checkElastic(t, specs, *ep, w)
			}
		})
	}
}

// checkElastic: the workers run under the agent with flags from the
// ElasticConfig (--launcher agent), or run flytekit's command once under it
// (--launcher command: torch's launcher inside starts the workers and owns
// the restarts); the init container installs the agent from the image; the
// master runs kfelastic master under its account.
func checkElastic(t *testing.T, specs map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaSpec, ep kubeflowv1.ElasticPolicy, w want) {
	t.Helper()
	image := optsFor(w).AgentImage
	if image == "" {
		image = DefaultAgentImage()
	}
	command := w.command
	if command == "" {
		command = "test-args"
	}
	ws := specs[W]
	c := container(ws, "pytorch")
	if len(c.Command) != 1 || c.Command[0] != AgentBinary || c.Args[0] != "agent" {
		t.Fatalf("worker command %v %v, want %s agent …", c.Command, c.Args, AgentBinary)
	}
	args := strings.Join(c.Args, " ")
	expect := []string{
		"--error-prefix s3://bucket/metadata/outputs/0",
		"--nnodes " + itoa(*ep.MinReplicas) + ":" + itoa(*ep.MaxReplicas),
		"--rdzv-endpoint job1-master-0:23456",
		"--token-file " + TokenFile,
		" -- " + command,
	}
	if w.commandMode {
		expect = append(expect, "agent --launcher command ", "--max-restarts 0 ")
		if strings.Contains(args, "--nproc-per-node") {
			t.Errorf("agent args %q: the command launcher must not start nproc-per-node copies of the command", args)
		}
	} else {
		expect = append(expect, "agent --launcher agent ",
			"--nproc-per-node "+itoa(*ep.NProcPerNode),
			"--max-restarts "+itoa(*ep.MaxRestarts))
	}
	for _, want := range expect {
		if !strings.Contains(args, want) {
			t.Errorf("agent args %q lack %q", args, want)
		}
	}
	if i := strings.Index(args, " -- "); i < 0 || !strings.HasPrefix(args[i+4:], command) || strings.Count(args[:i], " -- ") != 0 {
		t.Errorf("agent args %q do not end with the original command %q", args, command)
	}
	if len(ws.Template.Spec.InitContainers) != 1 || ws.Template.Spec.InitContainers[0].Image != image ||
		strings.Join(ws.Template.Spec.InitContainers[0].Command, " ") != "/kfelastic install /kfelastic-bin" {
		t.Errorf("init containers %+v, want %s running /kfelastic install /kfelastic-bin", ws.Template.Spec.InitContainers, image)
	}
	if !mounted(c, AgentBinDir) || !mounted(c, TokenDir) {
		t.Errorf("worker mounts %+v", c.VolumeMounts)
	}
	m := specs[M]
	mc := container(m, "pytorch")
	if mc.Image != image || strings.Join(mc.Command, " ") != AgentBinaryInImage || mc.Args[0] != "master" {
		t.Errorf("master container %v %v %v", mc.Image, mc.Command, mc.Args)
	}
	// The master knows how many pods the operator starts (their round
	// need not wait out the last call).
	if margs := strings.Join(mc.Args, " "); !strings.Contains(margs, "--expected-nodes "+itoa(*ws.Replicas)+" ") {
		t.Errorf("master args %q, want --expected-nodes %d", margs, *ws.Replicas)
	}
	if m.Template.Spec.ServiceAccountName != MasterAccountName("job1") || !mounted(mc, TokenDir) {
		t.Errorf("master account %q mounts %+v", m.Template.Spec.ServiceAccountName, mc.VolumeMounts)
	}
	if len(mc.Ports) != 2 || mc.Ports[0].Name != kubeflowv1.PyTorchJobDefaultPortName || mc.Ports[0].ContainerPort != MasterPort {
		t.Errorf("master ports %+v", mc.Ports)
	}
	if *ep.RDZVHost != "job1-master-0" || *ep.RDZVPort != MasterPort {
		t.Errorf("rdzv host/port %s:%d", *ep.RDZVHost, *ep.RDZVPort)
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

func mounted(c *corev1.Container, path string) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			return true
		}
	}
	return false
}

func hasEnv(c *corev1.Container, name, value, field string) bool {
	n := 0
	ok := false
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		n++
		if field != "" {
			ok = e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == field
		} else {
			ok = e.Value == value
		}
	}
	return n == 1 && ok
}

func keys[K comparable, V any](m map[K]V) []K {
	var out []K
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestBuildRefusesMissingPieces(t *testing.T) {
	tmpl := flytetest.LoadTemplate(t, "upstream-pytorch-v1-elastic")
	for name, opts := range map[string]Options{
		"no name":      {AgentImage: "img"},
		"no namespace": {Name: "j"},
	} {
		if _, err := BuildPyTorchJob(tmpl, fixedPods{tmpl}, opts); err == nil {
			t.Errorf("%s: built an elastic job", name)
		}
	}
	noArgs := flytetest.LoadTemplate(t, "upstream-pytorch-v1-elastic")
	noArgs.GetContainer().Args = nil
	if _, err := BuildPyTorchJob(noArgs, fixedPods{noArgs}, testOpts); err == nil || !strings.Contains(err.Error(), "neither command nor args") {
		t.Errorf("elastic task without a command: %v", err)
	}
	noCustom := flytetest.LoadTemplate(t, "upstream-pytorch-v0")
	noCustom.Custom = nil
	if _, err := BuildPyTorchJob(noCustom, fixedPods{noCustom}, testOpts); err == nil || !strings.Contains(err.Error(), "no custom field") {
		t.Errorf("template without custom: %v", err)
	}
	tf := flytetest.LoadTemplate(t, "upstream-tensorflow-v0")
	if _, err := BuildPyTorchJob(tf, fixedPods{tf}, testOpts); err == nil {
		t.Errorf("a tensorflow template built a PyTorchJob")
	}
	if _, err := BuildPyTorchJob(nil, fixedPods{}, testOpts); err == nil {
		t.Errorf("nil template built a job")
	}
}

// The image of this build's version is the default; before this default an
// elastic task with the default configuration was refused.
func TestDefaultAgentImage(t *testing.T) {
	if got, want := DefaultAgentImage(), version.Image(); got != want || !strings.HasPrefix(got, "ghcr.io/kfelastic/kfelastic:") {
		t.Errorf("DefaultAgentImage() = %q, want %q", got, want)
	}
}

func TestLauncherOf(t *testing.T) {
	for argv, want := range map[string]string{
		"pyflyte-execute --inputs s3://x -- task-module m task-name t":                          LauncherCommand,
		"pyflyte-fast-execute --additional-distribution s3://d --dest-dir . -- pyflyte-execute": LauncherCommand,
		"/usr/local/bin/pyflyte-execute --inputs s3://x":                                        LauncherCommand,
		"python3 train.py":                     LauncherAgent,
		"torchrun --nproc-per-node 2 train.py": LauncherAgent,
		"sh -c pyflyte-execute":                LauncherAgent,
		"pyflyte-map-execute --inputs s3://x":  LauncherAgent,
		"":                                     LauncherAgent,
	} {
		if got := LauncherOf(strings.Fields(argv)); got != want {
			t.Errorf("LauncherOf(%q) = %q, want %q", argv, got, want)
		}
	}
}

func TestMasterObjects(t *testing.T) {
	owner := &metav1.OwnerReference{APIVersion: "flyte.lyft.com/v1alpha1", Kind: "flyteworkflow", Name: "wf", UID: "u1"}
	objs := MasterObjects("job1", "ns1", "s3cr3t", owner, map[string]string{"execution-id": "e1"})
	if len(objs) != 4 {
		t.Fatalf("%d objects", len(objs))
	}
	for _, o := range objs {
		if o.GetNamespace() != "ns1" || len(o.GetOwnerReferences()) != 1 || o.GetLabels()[kubeflowv1.JobNameLabel] != "job1" {
			t.Errorf("%T %s: meta %+v", o, o.GetName(), o)
		}
	}
	secret := objs[0].(*corev1.Secret)
	if string(secret.Data[TokenKey]) != "s3cr3t" || secret.Name != TokenSecretName("job1") {
		t.Errorf("secret %+v", secret)
	}
}

// The master reads and writes the task's prefix with the workers' storage
// credentials (propeller's default-env-vars reach only the containers it
// builds, the workers'); the agent's own downward-API variables stay the
// workers'. Each worker learns its node rank from its replica index.
func TestMasterInheritsTheWorkersEnv(t *testing.T) {
	tmpl := flytetest.LoadTemplate(t, "upstream-pytorch-v1-elastic")
	tmpl.GetContainer().Env = append(tmpl.GetContainer().Env, &core.KeyValuePair{Key: "AWS_ACCESS_KEY_ID", Value: "key"})
	j, err := BuildPyTorchJob(tmpl, fixedPods{tmpl}, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	env := func(c *corev1.Container) map[string]corev1.EnvVar {
		m := map[string]corev1.EnvVar{}
		for _, e := range c.Env {
			if _, dup := m[e.Name]; dup {
				t.Errorf("%s: %s set twice", c.Name, e.Name)
			}
			m[e.Name] = e
		}
		return m
	}
	master := env(container(j.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeMaster], "pytorch"))
	worker := env(container(j.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker], "pytorch"))
	if master["AWS_ACCESS_KEY_ID"].Value != "key" {
		t.Errorf("master env %v: no storage credentials", master)
	}
	if _, ok := master[NodeRankEnv]; ok {
		t.Errorf("master has %s", NodeRankEnv)
	}
	if f := worker[NodeRankEnv].ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "metadata.labels['"+kubeflowv1.ReplicaIndexLabel+"']" {
		t.Errorf("worker's %s = %+v, want the replica-index label", NodeRankEnv, worker[NodeRankEnv])
	}
}

// A parameter-server job without a chief gets enableDynamicWorker, so that
// the training operator recreates a deleted worker instead of failing the
// job; one with a chief, or without ps, keeps the full cluster.
func TestTFJobDynamicWorkers(t *testing.T) {
	for name, want := range map[string]bool{
		"tensorflow-v1-ps-no-chief":          true,  // ps 1, workers 3
		"tensorflow-v1-ps":                   false, // and a chief
		"upstream-tensorflow-v0":             false, // ps 50 and a chief
		"upstream-tensorflow-v1-only-worker": false, // no ps
	} {
		tmpl := flytetest.LoadTemplate(t, name)
		j, err := BuildTFJob(tmpl, fixedPods{tmpl}, testOpts)
		if err != nil {
			t.Fatal(err)
		}
		if j.Spec.EnableDynamicWorker != want {
			t.Errorf("%s: enableDynamicWorker %t, want %t", name, j.Spec.EnableDynamicWorker, want)
		}
	}
}

// The plugin's taintFailedNodes reaches the master as --taint-failed-nodes;
// off by default (it needs a ClusterRole).
func TestMasterTaintFlag(t *testing.T) {
	two := int32(2)
	worker := &kubeflowv1.ReplicaSpec{Replicas: &two}
	for _, taint := range []bool{false, true} {
		o := testOpts
		o.TaintFailedNodes = taint
		m := masterReplica(nil, worker, 2, 3, o)
		args := strings.Join(m.Template.Spec.Containers[0].Args, " ")
		if strings.Contains(args, "--taint-failed-nodes") != taint {
			t.Errorf("TaintFailedNodes %v: master args %q", taint, args)
		}
	}
}
