package main

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"

	"github.com/kfelastic/kfelastic/agent"
	"github.com/kfelastic/kfelastic/internal/test/flytetest"
	"github.com/kfelastic/kfelastic/kfoperator"
)

func parseAgent(t *testing.T, env map[string]string, args ...string) (agent.Config, error) {
	t.Helper()
	for _, k := range []string{"PET_NNODES", "PET_NPROC_PER_NODE", "PET_MAX_RESTARTS", "PET_RDZV_ID", "PET_NODE_RANK",
		"PET_MASTER_ADDR", "PET_MASTER_PORT", "_F_WN", "FLYTE_INTERNAL_WORKER_NAME", "POD_NAME", "KFELASTIC_ERROR_PREFIX",
		nodeRankEnv} {
		t.Setenv(k, env[k])
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	var got agent.Config
	cmd := newAgentCmd(func(_ context.Context, c agent.Config) error { got = c; return nil })
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return got, err
}

func TestAgentFlagsTorchrunSpellings(t *testing.T) {
	c, err := parseAgent(t, map[string]string{"_F_WN": "job-worker-3"},
		"--nproc_per_node=2", "--nnodes", "2:4", "--max-restarts", "3", "--rdzv_id", "job1", "--node_rank", "3",
		"--monitor_interval", "1", "--redirects", "2", "--tee", "2", "--hang-timeout", "90s", "--dump-signal", "USR1",
		"--warm-spares", "--", "python3", "train.py", "--lr", "0.1")
	if err != nil {
		t.Fatal(err)
	}
	if c.NProcPerNode != 2 || c.MinNodes != 2 || c.MaxNodes != 4 || c.MaxRestarts != 3 || c.RdzvID != "job1" ||
		c.NodeRank != 3 || c.HangTimeout != 90*time.Second || c.DumpSignal != syscall.SIGUSR1 || !c.WarmSpares ||
		c.Pod != "job-worker-3" || c.NoStoreProxy {
		t.Errorf("config = %+v", c)
	}
	if len(c.Command) != 4 || c.Command[3] != "0.1" {
		t.Errorf("command = %q", c.Command)
	}
}

// PET_* env vars, as the training operator injects them, are defaults; flags win.
func TestAgentPETEnv(t *testing.T) {
	c, err := parseAgent(t, map[string]string{"PET_NNODES": "1", "PET_NPROC_PER_NODE": "3", "PET_MAX_RESTARTS": "5",
		"PET_RDZV_ID": "pj", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "pj-master-0", "PET_MASTER_PORT": "23456",
		"POD_NAME": "pj-worker-0", "KFELASTIC_ERROR_PREFIX": "file:///out"},
		"--max_restarts", "1", "python3", "train.py")
	if err != nil {
		t.Fatal(err)
	}
	if c.NProcPerNode != 3 || c.MaxRestarts != 1 || c.RdzvID != "pj" || c.MasterAddr != "pj-master-0" ||
		c.MasterPort != 23456 || c.Pod != "pj-worker-0" || c.MinNodes != 1 || c.MaxNodes != 1 {
		t.Errorf("config = %+v", c)
	}
	if c.ErrorPrefix != "file:///out" {
		t.Errorf("error prefix %q, want KFELASTIC_ERROR_PREFIX's", c.ErrorPrefix)
	}
	if c.Launcher != "agent" {
		t.Errorf("launcher %q, want agent by default", c.Launcher)
	}
}

// The store proxy is on unless --store-proxy=false.
func TestAgentStoreProxyFlag(t *testing.T) {
	c, err := parseAgent(t, nil, "--store-proxy=false", "--", "python3", "train.py")
	if err != nil {
		t.Fatal(err)
	}
	if !c.NoStoreProxy {
		t.Error("--store-proxy=false: proxy still on")
	}
}

// The fork server is on unless --fork-server=false.
func TestAgentForkServerFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		off  bool
	}{{nil, false}, {[]string{"--fork-server=false"}, true}} {
		cfg, err := parseAgent(t, nil, append(c.args, "--", "python3", "train.py")...)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.NoForkServer != c.off {
			t.Errorf("%v: NoForkServer %t, want %t", c.args, cfg.NoForkServer, c.off)
		}
	}
}

func TestAgentFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--nnodes", "3:2", "--", "x"},
		{"--nnodes", "0", "--", "x"},
		{"--nproc-per-node", "zero", "--", "x"},
		{"--nproc-per-node", "0", "--", "x"},
		{"--nproc-per-node", "100000", "--", "x"},
		{"--dump-signal", "SIGNOPE", "--", "x"},
		{"--dump-signal", "SIGKILL", "--", "x"},
		{"--dump-signal", "STOP", "--", "x"},
		{"--dump-signal", "9", "--", "x"},
		{"--dump-signal", "99", "--", "x"},
		{"--nproc-per-node", "gpu", "--", "x"},
		{"--stop-grace", "-1s", "--", "x"},
		{"--stop-grace", "0s", "--", "x"},
		{"--storage-timeout", "0s", "--", "x"},
		{"--hang-timeout", "-5m", "--", "x"},
		{"--dump-timeout", "-1s", "--", "x"},
		{"--master-port", "99999", "--", "x"},
		{"--master-port", "-1", "--", "x"},
		{"--node-rank", "-2", "--", "x"},
		{"--max-restarts", "-1", "--", "x"},
		{"--monitor-interval", "-1", "--", "x"},
		{"--monitor-interval", "NaN", "--", "x"},
		{"--launcher", "torchrun", "--", "x"},
		{"--rdzv-endpoint", "master:abc", "--", "x"},
		{"--rdzv-endpoint", ":29400", "--", "x"},
		{"--rdzv-endpoint", "master:65536", "--", "x"},
		{"--rdzv-backend", "zookeeper", "--", "x"},
	} {
		if _, err := parseAgent(t, nil, args...); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "--")) {
			t.Errorf("%q: %v, want an error naming the flag", args, err)
		}
	}
	// The operator's PET_* values meet the same checks.
	if _, err := parseAgent(t, map[string]string{"PET_NPROC_PER_NODE": "100000"}, "x"); err == nil {
		t.Error("PET_NPROC_PER_NODE=100000: no error")
	}
	if _, err := parseAgent(t, map[string]string{"PET_MAX_RESTARTS": "many"}, "x"); err == nil {
		t.Error("PET_MAX_RESTARTS=many: no error")
	}
}

// --rdzv-endpoint as torchrun reads it: the port defaults to 29400, an IPv6
// address goes in brackets; anything else that does not name one host and
// one port is refused, naming the flag.
func TestParseRdzvEndpoint(t *testing.T) {
	for _, c := range []struct{ in, want, why string }{
		{"master", "master:29400", ""},
		{"job-master-0.ns.svc:23456", "job-master-0.ns.svc:23456", ""},
		{"10.0.0.7", "10.0.0.7:29400", ""},
		{"10.0.0.7:1", "10.0.0.7:1", ""},
		{"master:65535", "master:65535", ""},
		{"[::1]:29400", "[::1]:29400", ""},
		{"[::1]", "[::1]:29400", ""},
		{"[fe80::1%eth0]:5", "[fe80::1%eth0]:5", ""},
		{"master:abc", "", `port "abc"`},
		{"master:", "", `port ""`},
		{"master:0", "", `port "0"`},
		{"master:65536", "", `port "65536"`},
		{"master:-1", "", `port "-1"`},
		{"master:+80", "", `port "+80"`},
		{":29400", "", "no host"},
		{"[]:29400", "", "no host"},
		{"[]", "", "no host"},
		{"::1", "", "brackets"},
		{"[::1", "", "bracket"},
		{"[master]", "master:29400", ""},
		{"[1::x]", "", "not an IPv6 address"},
		{"http://master:29400", "", "brackets"},
		{"master:29400/", "", `port "29400/"`},
		{"mas ter", "", "not a host name"},
		{"m\xffaster", "", "not a host name"},
	} {
		got, err := parseRdzvEndpoint(c.in)
		switch {
		case c.why == "" && (err != nil || got != c.want):
			t.Errorf("%q: %q, %v; want %q", c.in, got, err, c.want)
		case c.why != "" && (err == nil || !strings.Contains(err.Error(), "--rdzv-endpoint") || !strings.Contains(err.Error(), c.why)):
			t.Errorf("%q: %q, %v; want an error naming --rdzv-endpoint and saying %q", c.in, got, err, c.why)
		}
	}
}

// The endpoint reaches the config with its port; every backend torchrun
// knows is accepted, and an unknown one is refused with the list.
func TestAgentRendezvousFlags(t *testing.T) {
	cfg, err := parseAgent(t, map[string]string{"PET_RDZV_ENDPOINT": "job-master-0"}, "--nnodes", "1:2", "--", "true")
	if err != nil || cfg.RdzvEndpoint != "job-master-0:29400" {
		t.Errorf("PET_RDZV_ENDPOINT=job-master-0: endpoint %q, %v; want job-master-0:29400", cfg.RdzvEndpoint, err)
	}
	for _, b := range []string{"static", "c10d", "etcd", "etcd-v2", "kfelastic"} {
		if cfg, err := parseAgent(t, nil, "--rdzv-backend", b, "--", "true"); err != nil || cfg.RdzvBackend != b {
			t.Errorf("--rdzv-backend %s: %q, %v", b, cfg.RdzvBackend, err)
		}
	}
	_, err = parseAgent(t, nil, "--rdzv-backend", "C10D", "--", "true")
	if err == nil || !strings.Contains(err.Error(), "static, c10d, etcd, etcd-v2, kfelastic") {
		t.Errorf("--rdzv-backend C10D: %v, want a refusal listing the backends", err)
	}
}

// The real binary refuses a malformed --rdzv-endpoint or an unknown
// --rdzv-backend within seconds, exit 1, naming the flag: it used to dial
// "master:abc" and retry it as an unreachable master for 10 minutes.
func TestAgentRefusesBadRendezvousAtStart(t *testing.T) {
	bin := shortBinary(t)
	tok := tokenFile(t, "the-token\n")
	for _, c := range []struct{ flag, value, want string }{
		{"--rdzv-endpoint", "master:abc", `--rdzv-endpoint "master:abc": port "abc" is not a number 1 to 65535`},
		{"--rdzv-endpoint", ":29400", `--rdzv-endpoint ":29400": no host`},
		{"--rdzv-endpoint", "master:99999", `--rdzv-endpoint "master:99999": port "99999"`},
		{"--rdzv-backend", "zookeeper", `--rdzv-backend "zookeeper": want one of static, c10d, etcd, etcd-v2, kfelastic`},
	} {
		args := []string{"agent", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1", "--token-file", tok,
			c.flag, c.value, "--", "true"}
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
		start := time.Now()
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		took := time.Since(start)
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || took > 10*time.Second || !strings.Contains(string(out), c.want) {
			t.Errorf("%s %s: %v after %v, want exit 1 at once saying %q\n%s", c.flag, c.value, err, took.Round(time.Millisecond), c.want, out)
		}
	}
}

func TestExitCodeOfAgentError(t *testing.T) {
	if got := exitCode(&agent.ExitError{Code: 143}); got != 143 {
		t.Errorf("exitCode = %d", got)
	}
}

// The seam between the plugin and the agent: the command kfoperator wraps an
// elastic task's workers with parses as the agent's own flags, with the
// training operator's PET_* variables set as it sets them. flytekit's
// commands (pyflyte-execute, pyflyte-fast-execute, as in the flytekit
// template of testdata/tasks) run once under the command launcher, with no
// restart budget of the agent's own: torch's launcher inside spends the
// task's; anything else under the agent's launcher with the task's
// nproc_per_node and restarts.
func TestAgentParsesThePluginsWrapping(t *testing.T) {
	fast := flytetest.LoadTemplate(t, "flytekit-elastic-fast-execute").GetContainer().GetArgs()
	for _, c := range []struct {
		args                  []string
		launcher              string
		nproc, restarts       int
		wantCommandStartsWith string
	}{
		{[]string{"pyflyte-execute", "--task-module", "train"}, "command", 2, 0, "pyflyte-execute --task-module train"},
		{fast, "command", 2, 0, "pyflyte-fast-execute --additional-distribution s3://"},
		{[]string{"python3", "train.py", "--lr", "0.1"}, "agent", 2, 3, "python3 train.py --lr 0.1"},
	} {
		t.Run(c.launcher+"/"+c.args[0], func(t *testing.T) {
			custom, _ := structpb.NewStruct(map[string]any{
				"workerReplicas": map[string]any{"replicas": 2},
				"elasticConfig":  map[string]any{"rdzvBackend": "c10d", "minReplicas": 2, "maxReplicas": 4, "nprocPerNode": 2, "maxRestarts": 3},
			})
			container := &core.Container{Image: "trainer:1", Args: c.args}
			tmpl := &core.TaskTemplate{Type: "pytorch", TaskTypeVersion: 1, Custom: custom, Target: &core.TaskTemplate_Container{Container: container}}
			job, err := kfoperator.BuildPyTorchJob(tmpl, singleContainer{container}, kfoperator.Options{
				Name: "f3a-n0-0", Namespace: "ns", ErrorPrefix: "s3://flyte/metadata/f3a/n0/data/0", AgentImage: "kfelastic:test",
				NetworkCheck: true, ExcludeStraggler: true, HangTimeoutSec: 900,
			})
			if err != nil {
				t.Fatal(err)
			}
			w := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker].Template.Spec.Containers[0]
			if len(w.Command) != 1 || len(w.Args) == 0 || w.Args[0] != "agent" {
				t.Fatalf("worker is not wrapped with the agent: %q %q", w.Command, w.Args)
			}
			// As the operator sets them for this ElasticPolicy, on the pod of
			// worker index 1: with a Master replica (the kfelastic master)
			// training-operator v1.8 numbers workers from 1 and counts the
			// master in WORLD_SIZE (setPodEnv). The replica index reaches
			// the agent through the plugin's downward-API env.
			env := map[string]string{"PET_NNODES": "2:4", "PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "3",
				"PET_RDZV_ID": "f3a-n0-0", "_F_WN": "f3a-n0-0-worker-1",
				"PET_NODE_RANK": "2", "RANK": "2", "WORLD_SIZE": "6", "MASTER_ADDR": "f3a-n0-0-master-0", "MASTER_PORT": "23456",
				"PET_MASTER_ADDR": "f3a-n0-0-master-0", "PET_MASTER_PORT": "23456"}
			for _, e := range w.Env {
				if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
					e.ValueFrom.FieldRef.FieldPath == "metadata.labels['"+kubeflowv1.ReplicaIndexLabel+"']" {
					env[e.Name] = "1"
				}
			}
			cfg, err := parseAgent(t, env, w.Args[1:]...)
			if err != nil {
				t.Fatalf("the agent refuses the plugin's command %q: %v", w.Args, err)
			}
			if cfg.Launcher != c.launcher || cfg.NProcPerNode != c.nproc || cfg.MaxRestarts != c.restarts {
				t.Errorf("launcher %q, nproc %d, max restarts %d; want %q, %d, %d (args %q)",
					cfg.Launcher, cfg.NProcPerNode, cfg.MaxRestarts, c.launcher, c.nproc, c.restarts, w.Args)
			}
			if cfg.MinNodes != 2 || cfg.MaxNodes != 4 || cfg.RdzvID != "f3a-n0-0" || cfg.RdzvEndpoint != "f3a-n0-0-master-0:23456" ||
				cfg.ErrorPrefix != "s3://flyte/metadata/f3a/n0/data/0" || cfg.TokenFile != kfoperator.TokenFile ||
				cfg.HangTimeout != 15*time.Minute || cfg.Pod != "f3a-n0-0-worker-1" || cfg.NodeRank != 1 {
				t.Errorf("config = %+v", cfg)
			}
			if got := strings.Join(cfg.Command, " "); !strings.HasPrefix(got, c.wantCommandStartsWith) || len(cfg.Command) != len(c.args) {
				t.Errorf("worker command = %q, want the task's %q", got, c.args)
			}
		})
	}
}

// The binary names the plugin's replica-index variable without linking the
// plugin's builders.
func TestNodeRankEnvIsThePlugins(t *testing.T) {
	if nodeRankEnv != kfoperator.NodeRankEnv {
		t.Errorf("agent reads %s, the plugin sets %s", nodeRankEnv, kfoperator.NodeRankEnv)
	}
}

// A flag given wins over the replica index; PET_NODE_RANK serves only
// without it (an agent run by hand under the operator, no Master replica).
func TestNodeRankSources(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		args []string
		want int
	}{
		{map[string]string{"PET_NODE_RANK": "2", nodeRankEnv: "1"}, nil, 1},
		{map[string]string{"PET_NODE_RANK": "2", nodeRankEnv: "1"}, []string{"--node-rank", "0"}, 0},
		{map[string]string{"PET_NODE_RANK": "2"}, nil, 2},
		{map[string]string{}, nil, -1},
	} {
		cfg, err := parseAgent(t, c.env, append(c.args, "--nnodes", "1:4", "--", "true")...)
		if err != nil || cfg.NodeRank != c.want {
			t.Errorf("env %v args %q: node rank %d, %v; want %d", c.env, c.args, cfg.NodeRank, err, c.want)
		}
	}
	if _, err := parseAgent(t, map[string]string{nodeRankEnv: "one"}, "--", "true"); err == nil || !strings.Contains(err.Error(), nodeRankEnv) {
		t.Errorf("%s=one: %v, want an error naming it", nodeRankEnv, err)
	}
}

// singleContainer renders every replica from the task's container as is.
type singleContainer struct{ c *core.Container }

func (p singleContainer) PodTemplate(*core.Resources) (corev1.PodTemplateSpec, string, error) {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "pytorch", Image: p.c.GetImage(), Args: p.c.GetArgs()},
	}}}, "pytorch", nil
}

// Every numeric flag states what it accepts in --help.
func TestAgentHelpStatesRanges(t *testing.T) {
	cmd := newAgentCmd(func(context.Context, agent.Config) error { return nil })
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"nproc-per-node", "nnodes", "max-restarts", "node-rank", "master-port", "monitor-interval",
		"hang-timeout", "dump-signal", "dump-timeout", "stop-grace", "storage-timeout"} {
		f := cmd.Flags().Lookup(flag)
		if f == nil || !strings.ContainsAny(f.Usage, "≥≤>") && !strings.Contains(f.Usage, " to ") {
			t.Errorf("--%s does not state its range: %q", flag, f.Usage)
		}
	}
}

// The operator's PET_MASTER_ADDR/PORT name its Master replica (the
// kfelastic master in an elastic job): only the static backend reads them.
func TestMasterAddrOnlyForStatic(t *testing.T) {
	env := map[string]string{"PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456", "PET_RDZV_BACKEND": "c10d"}
	cfg, err := parseAgent(t, env, "--nnodes", "2:3", "--", "true")
	if err != nil || cfg.MasterAddr != "" || cfg.MasterPort != 0 {
		t.Errorf("c10d: master %q:%d, %v; want neither", cfg.MasterAddr, cfg.MasterPort, err)
	}
	env["PET_RDZV_BACKEND"] = "static"
	cfg, err = parseAgent(t, env, "--nnodes", "2", "--node-rank", "0", "--", "true")
	if err != nil || cfg.MasterAddr != "job-master-0" || cfg.MasterPort != 23456 {
		t.Errorf("static: master %q:%d, %v; want job-master-0:23456", cfg.MasterAddr, cfg.MasterPort, err)
	}
}
