package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/kfoperator"
	"github.com/kfelastic/kfelastic/master"
)

func parseMaster(t *testing.T, args ...string) (master.Options, *masterFlags, error) {
	t.Helper()
	var got master.Options
	var flags *masterFlags
	cmd := newMasterCmd(func(_ context.Context, o master.Options, f *masterFlags) error { got, flags = o, f; return nil })
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return got, flags, err
}

func tokenFile(t *testing.T, content string) string {
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The seam between the plugin and the master: the Master replica kfoperator
// builds for an elastic task starts with exactly what it renders.
func TestMasterParsesThePluginsReplica(t *testing.T) {
	custom, _ := structpb.NewStruct(map[string]any{
		"workerReplicas": map[string]any{"replicas": 2},
		"elasticConfig":  map[string]any{"minReplicas": 2, "maxReplicas": 4, "nprocPerNode": 2, "maxRestarts": 3},
	})
	container := &core.Container{Image: "trainer:1", Args: []string{"pyflyte-execute", "--task-module", "train"}}
	tmpl := &core.TaskTemplate{Type: "pytorch", TaskTypeVersion: 1, Custom: custom, Target: &core.TaskTemplate_Container{Container: container}}
	job, err := kfoperator.BuildPyTorchJob(tmpl, singleContainer{container}, kfoperator.Options{
		Name: "f3a-n0-0", Namespace: "ns", ErrorPrefix: "s3://flyte/metadata/f3a/n0/data/0?endpoint=http://minio:9000",
		AgentImage: "kfelastic:test", NetworkCheck: true, ExcludeStraggler: true, OOMFactor: 2, OOMMaxIncrement: "4Gi",
		OOMMaxMemory: "32Gi", MaxRelaunches: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	mc := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeMaster].Template.Spec.Containers[0]
	if mc.Args[0] != "master" {
		t.Fatalf("master replica runs %q", mc.Args)
	}
	args := append([]string{}, mc.Args[1:]...)
	for i := range args {
		if args[i] == kfoperator.TokenFile {
			args[i] = tokenFile(t, "the-token\n") // the Secret the plugin mounts there
		}
	}
	o, f, err := parseMaster(t, args...)
	if err != nil {
		t.Fatalf("the master refuses the plugin's command %q: %v", mc.Args, err)
	}
	j := o.Job
	if j.JobID != "f3a-n0-0" || j.MinNodes != 2 || j.MaxNodes != 4 || !j.NetworkCheck || !j.ExcludeStraggler ||
		j.Relaunch.MaxPerRank != 3 || j.Relaunch.OOM.Factor != 2 || j.Relaunch.OOM.MaxIncrement != 4<<30 || j.Relaunch.OOM.Max != 32<<30 {
		t.Errorf("job config %+v", j)
	}
	if o.Token != "the-token" || o.StateURL != "s3://flyte/metadata/f3a/n0/data/0/kfelastic-master?endpoint=http://minio:9000" ||
		o.EventsURL != "s3://flyte/metadata/f3a/n0/data/0?endpoint=http://minio:9000" {
		t.Errorf("token %q, state %q, events %q", o.Token, o.StateURL, o.EventsURL)
	}
	if f.listen != ":23456" || f.kubeNamespace != "ns" || f.kubeJob != "f3a-n0-0" || f.metricsListen != ":9090" {
		t.Errorf("flags %+v", f)
	}
	// The agents meet the master where it listens.
	w := job.Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker].Template.Spec.Containers[0]
	if !strings.Contains(strings.Join(w.Args, " "), "--rdzv-endpoint f3a-n0-0-master-0:23456") {
		t.Errorf("agents' endpoint: %q", w.Args)
	}
}

func TestMasterFlagErrors(t *testing.T) {
	tok := tokenFile(t, "x")
	empty := tokenFile(t, "\n")
	base := []string{"--nnodes", "1:2", "--token-file", tok, "--state", "mem://"}
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	for name, args := range map[string][]string{
		"no nnodes":          {"--token-file", tok, "--state", "mem://"},
		"bad nnodes":         with("--nnodes", "3:2"),
		"no token":           {"--nnodes", "1:2", "--state", "mem://"},
		"empty token":        with("--token-file", empty),
		"missing token":      with("--token-file", "/no/such/file"),
		"no state":           {"--nnodes", "1:2", "--token-file", tok},
		"bad listen":         with("--listen", "nope"),
		"negative waiting":   with("--waiting-timeout", "-1s"),
		"zero heartbeat":     with("--heartbeat-interval", "0s"),
		"timeout < interval": with("--heartbeat-interval", "10s", "--heartbeat-timeout", "5s"),
		"expected > max":     with("--expected-nodes", "3"),
		"expected < min":     with("--nnodes", "2:3", "--expected-nodes", "1"),
		"node unit 0":        with("--node-unit", "0"),
		"node unit > max":    with("--node-unit", "3"),
		"negative relaunch":  with("--max-relaunches", "-1"),
		"oom factor 1":       with("--oom-factor", "1"),
		"bad quantity":       with("--oom-max-memory", "lots"),
		"half kube":          with("--kube-namespace", "ns"),
		"bad metrics listen": with("--metrics-listen", "9090"),
		"zero state timeout": with("--state-timeout", "0s"),
	} {
		if _, _, err := parseMaster(t, args...); err == nil {
			t.Errorf("%s (%q): no error", name, args)
		}
	}
	o, _, err := parseMaster(t, base...)
	if err != nil {
		t.Fatal(err)
	}
	if o.Job.WaitingTimeout != master.DefaultWaitingTimeout || o.HeartbeatInterval != 5*time.Second || o.Job.HeartbeatTimeout != 30*time.Second ||
		o.StateTimeout != 2*time.Minute {
		t.Errorf("defaults %+v", o)
	}
}

// `kfelastic master` on a --state store that accepts and never answers
// fails within --state-timeout, naming it, instead of waiting without end.
func TestMasterStateTimeout(t *testing.T) {
	silent := testenv.Silent(t)
	t.Setenv("AWS_ACCESS_KEY_ID", testenv.MinIOAccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", testenv.MinIOSecretKey)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	cmd := newMasterCmd(serveMaster)
	cmd.SetArgs([]string{"--nnodes", "1:2", "--token-file", tokenFile(t, "tok"), "--listen", "127.0.0.1:0",
		"--state", silent.URL("flyte", "job/kfelastic-master"), "--state-timeout", "1s"})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	err := cmd.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "no answer within --state-timeout 1s") || time.Since(start) > 5*time.Second {
		t.Errorf("%v after %v, want a --state-timeout error within about 1s", err, time.Since(start))
	}
}
