package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/agent"
)

func parseAgent(t *testing.T, env map[string]string, args ...string) (agent.Config, error) {
	t.Helper()
	for _, k := range []string{"PET_NNODES", "PET_NPROC_PER_NODE", "PET_MAX_RESTARTS", "PET_RDZV_ID", "PET_NODE_RANK",
		"PET_MASTER_ADDR", "PET_MASTER_PORT", "_F_WN", "FLYTE_INTERNAL_WORKER_NAME", "POD_NAME", "KFELASTIC_ERROR_PREFIX"} {
		t.Setenv(k, env[k])
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
		c.Pod != "job-worker-3" {
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
}

func TestAgentFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--nnodes", "3:2", "--", "x"},
		{"--nproc-per-node", "zero", "--", "x"},
		{"--dump-signal", "SIGNOPE", "--", "x"},
		{"--nproc-per-node", "gpu", "--", "x"},
	} {
		if _, err := parseAgent(t, nil, args...); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if _, err := parseAgent(t, map[string]string{"PET_MAX_RESTARTS": "many"}, "x"); err == nil {
		t.Error("PET_MAX_RESTARTS=many: no error")
	}
}

func TestExitCodeOfAgentError(t *testing.T) {
	if got := exitCode(&agent.ExitError{Code: 143}); got != 143 {
		t.Errorf("exitCode = %d", got)
	}
}
