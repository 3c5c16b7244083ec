package plugin

import (
	"context"
	"strings"
	"testing"

	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/k8s"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/k8s/kfoperators/pytorch"    // upstream, to compare with
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/k8s/kfoperators/tensorflow" // upstream, to compare with
	"github.com/flyteorg/flyte/flytestdlib/storage"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kfelastic/kfelastic/internal/test/flytetest"
	"github.com/kfelastic/kfelastic/internal/version"
	"github.com/kfelastic/kfelastic/kfoperator"
)

func memStore(t testing.TB) *storage.DataStore {
	t.Helper()
	s, err := flytetest.MemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// upstreamPlugin is flyteplugins' own kfoperator plugin for a task type, as
// its init registered it.
func upstreamPlugin(t testing.TB, taskType string) k8s.Plugin {
	t.Helper()
	for _, e := range pluginmachinery.PluginRegistry().GetK8sPlugins() {
		if e.ID == taskType {
			return e.Plugin
		}
	}
	t.Fatalf("upstream plugin %q is not registered", taskType)
	return nil
}

func testConfig() *Config {
	c := DefaultConfig()
	c.AgentImage = "ghcr.io/kfelastic/kfelastic:test"
	c.ListPods = false
	return &c
}

// stripErrorEnv removes _F_WN and _F_DES, which we set on every replica and
// upstream on PyTorch v1 workers only (and _F_DES only when opted in).
func stripErrorEnv(specs map[kubeflowv1.ReplicaType]*kubeflowv1.ReplicaSpec) {
	for _, rs := range specs {
		for i := range rs.Template.Spec.Containers {
			c := &rs.Template.Spec.Containers[i]
			var env []corev1.EnvVar
			for _, e := range c.Env {
				if e.Name != kfoperator.EnvWorkerName && e.Name != kfoperator.EnvDistErrorStrategy {
					env = append(env, e)
				}
			}
			c.Env = env
		}
	}
}

// TestBuildResourceMatchesUpstream: for every valid template in
// testdata/tasks, where upstream builds a correct object ours is the same
// apart from error propagation on every replica and enableDynamicWorker on
// a parameter-server TFJob without a chief; elastic jobs (upstream
// drops the master, we run kfelastic's there and wrap the workers) agree on
// the elastic policy and on the workers' count, image and resources.
func TestBuildResourceMatchesUpstream(t *testing.T) {
	ctx := context.Background()
	compared := 0
	for _, name := range flytetest.TemplateNames(t, "") {
		if strings.HasPrefix(name, "bad-") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			tmpl := flytetest.LoadTemplate(t, name)
			tctx := flytetest.Task{Template: tmpl, Name: "job-" + name, Namespace: "ns", Prefix: "s3://bucket/metadata/" + storage.DataReference(name), Store: memStore(t)}.Context(ctx)
			ours := New(tmpl.GetType(), testConfig(), nil)
			// buildJob: BuildResource without creating the elastic master's
			// objects (the manager test creates them on a real API server).
			got, _, err := ours.buildJob(ctx, tctx)
			if err != nil {
				t.Fatal(err)
			}
			want, err := upstreamPlugin(t, tmpl.GetType()).BuildResource(ctx, tctx)
			if err != nil {
				t.Fatalf("upstream: %v", err)
			}
			compared++
			switch g := got.(type) {
			case *kubeflowv1.TFJob:
				w := want.(*kubeflowv1.TFJob)
				stripErrorEnv(g.Spec.TFReplicaSpecs)
				stripErrorEnv(w.Spec.TFReplicaSpecs)
				// Ours sets enableDynamicWorker on a chief-less PS job
				// (kfoperator.dynamicWorkers); upstream never does.
				if g.Spec.EnableDynamicWorker && g.Spec.TFReplicaSpecs[kubeflowv1.TFJobReplicaTypeChief] == nil &&
					g.Spec.TFReplicaSpecs[kubeflowv1.TFJobReplicaTypePS] != nil {
					w.Spec.EnableDynamicWorker = true
				}
				if !equality.Semantic.DeepEqual(g, w) {
					t.Errorf("TFJob differs from upstream:\n ours %+v\n upstream %+v", g.Spec, w.Spec)
				}
			case *kubeflowv1.PyTorchJob:
				w := want.(*kubeflowv1.PyTorchJob)
				stripErrorEnv(g.Spec.PyTorchReplicaSpecs)
				stripErrorEnv(w.Spec.PyTorchReplicaSpecs)
				if g.Spec.ElasticPolicy == nil {
					if !equality.Semantic.DeepEqual(g, w) {
						t.Errorf("PyTorchJob differs from upstream:\n ours %+v\n upstream %+v", g.Spec, w.Spec)
					}
					return
				}
				ge, we := g.Spec.ElasticPolicy, w.Spec.ElasticPolicy
				if *we.RDZVBackend == "" {
					// Upstream passes an empty backend through to the
					// operator; we fill in the configured default.
					c10d := kubeflowv1.BackendC10D
					we.RDZVBackend = &c10d
				}
				if *ge.MinReplicas != *we.MinReplicas || *ge.MaxReplicas != *we.MaxReplicas || *ge.NProcPerNode != *we.NProcPerNode ||
					*ge.MaxRestarts != *we.MaxRestarts || *ge.RDZVBackend != *we.RDZVBackend {
					t.Errorf("elastic policy %+v, upstream %+v", ge, we)
				}
				gw, ww := g.Spec.PyTorchReplicaSpecs["Worker"], w.Spec.PyTorchReplicaSpecs["Worker"]
				gc, wc := gw.Template.Spec.Containers[0], ww.Template.Spec.Containers[0]
				if *gw.Replicas != *ww.Replicas || gc.Image != wc.Image || !equality.Semantic.DeepEqual(gc.Resources, wc.Resources) {
					t.Errorf("elastic worker %d %s %v, upstream %d %s %v", *gw.Replicas, gc.Image, gc.Resources, *ww.Replicas, wc.Image, wc.Resources)
				}
			}
		})
	}
	if compared < 8 {
		t.Errorf("compared only %d templates with upstream", compared)
	}
}

// TestBuildResourceWrapsFlytekitElastic: with the default config (no
// agentImage set), flytekit's Elastic templates build — the agent installed
// from the image of the plugin's version by `/kfelastic install`, the
// rendered pyflyte-execute / pyflyte-fast-execute command run once under
// `--launcher command` (torch's elastic_launch inside starts the workers),
// flytekit's /dev/shm volume kept — and any other command runs under
// `--launcher agent` with the task's nproc_per_node.
func TestBuildResourceWrapsFlytekitElastic(t *testing.T) {
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.ListPods = false
	for _, c := range []struct {
		template, launcher, command string
		shm                         bool
	}{
		{"flytekit-elastic-pyflyte-execute", kfoperator.LauncherCommand, "pyflyte-execute --inputs s3://bucket/metadata/flytekit-elastic-pyflyte-execute/inputs/inputs.pb --output-prefix ", true},
		{"flytekit-elastic-fast-execute", kfoperator.LauncherCommand, "pyflyte-fast-execute --additional-distribution s3://my-s3-bucket/", false},
		{"upstream-pytorch-v1-elastic", kfoperator.LauncherAgent, "test-args", false},
	} {
		t.Run(c.template, func(t *testing.T) {
			tmpl := flytetest.LoadTemplate(t, c.template)
			tctx := flytetest.Task{Template: tmpl, Name: "job-" + c.template, Namespace: "ns", Prefix: storage.DataReference("s3://bucket/metadata/" + c.template), Store: memStore(t)}.Context(ctx)
			obj, _, err := New(tmpl.GetType(), &cfg, nil).buildJob(ctx, tctx)
			if err != nil {
				t.Fatalf("default config: %v", err)
			}
			job := obj.(*kubeflowv1.PyTorchJob)
			ws := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker].Template.Spec
			w := ws.Containers[0]
			args := strings.Join(w.Args, " ")
			if !strings.HasPrefix(args, "agent --launcher "+c.launcher+" ") || strings.Contains(args, "{{") {
				t.Errorf("worker args %q, want agent --launcher %s and a rendered command", args, c.launcher)
			}
			if i := strings.Index(args, " -- "); i < 0 || !strings.HasPrefix(args[i+4:], c.command) {
				t.Errorf("worker args %q: the wrapped command does not start with %q", args, c.command)
			}
			if (c.launcher == kfoperator.LauncherCommand) == strings.Contains(args, "--nproc-per-node") {
				t.Errorf("worker args %q: --nproc-per-node belongs to the agent launcher only", args)
			}
			image := DefaultConfig().AgentImage
			if len(ws.InitContainers) != 1 || ws.InitContainers[0].Image != image ||
				strings.Join(ws.InitContainers[0].Command, " ") != "/kfelastic install /kfelastic-bin" {
				t.Errorf("init containers %+v, want %s running /kfelastic install /kfelastic-bin", ws.InitContainers, image)
			}
			if m := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeMaster].Template.Spec.Containers[0]; m.Image != image || m.Args[0] != "master" {
				t.Errorf("master %s %q, want %s master", m.Image, m.Args, image)
			}
			shm := false
			for _, m := range w.VolumeMounts {
				shm = shm || m.MountPath == "/dev/shm"
			}
			if shm != c.shm {
				t.Errorf("/dev/shm mounted: %v, want %v (flytekit's pod template)", shm, c.shm)
			}
		})
	}
}

// The default agent image is the image of the plugin's own version.
func TestDefaultConfigAgentImage(t *testing.T) {
	if got := DefaultConfig().AgentImage; got == "" || got != kfoperator.DefaultAgentImage() || got != version.Image() {
		t.Errorf("default agentImage %q, want %q", got, version.Image())
	}
}

func TestBuildResourceRefusesBadTemplates(t *testing.T) {
	ctx := context.Background()
	for _, name := range flytetest.TemplateNames(t, "bad-") {
		tmpl := flytetest.LoadTemplate(t, name)
		tctx := flytetest.Task{Template: tmpl, Name: "j", Namespace: "ns", Prefix: "s3://b/m", Store: memStore(t)}.Context(ctx)
		if _, err := New(tmpl.GetType(), testConfig(), nil).BuildResource(ctx, tctx); err == nil || !strings.Contains(err.Error(), "BadTaskSpecification") {
			t.Errorf("%s: %v, want a BadTaskSpecification error", name, err)
		}
	}
}

func TestErrorPrefixURL(t *testing.T) {
	for in, want := range map[string]string{
		"s3://my-bucket/metadata/propeller/abc/n0/data/0": "s3://my-bucket/metadata/propeller/abc/n0/data/0?endpoint=http://minio:9000",
		"gs://b/x/y/":      "gs://b/x/y",
		"/tmp/flyte/out/0": "file:///tmp/flyte/out/0",
	} {
		got, err := ErrorPrefixURL(storage.DataReference(in), "endpoint=http://minio:9000")
		if err != nil || got != want {
			t.Errorf("ErrorPrefixURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ErrorPrefixURL("ftp://host/x", ""); err == nil {
		t.Errorf("ftp:// accepted")
	}
}

func TestRegistered(t *testing.T) {
	found := map[string]bool{}
	for _, e := range pluginmachinery.PluginRegistry().GetK8sPlugins() {
		if _, ok := e.Plugin.(*Plugin); ok {
			for _, tt := range e.RegisteredTaskTypes {
				found[string(tt)] = true
			}
		}
	}
	if !found["pytorch"] || !found["tensorflow"] {
		t.Errorf("registered task types %v", found)
	}
	var _ metav1.Object = &kubeflowv1.PyTorchJob{}
}
