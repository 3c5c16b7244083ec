package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A bad flag or --chaos spec is refused before anything starts: the error
// names what is wrong, and no output folder (no master, no pod) exists.
func TestLocalRefusesBadSpecsBeforeStarting(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nnodes", "2:3", "--chaos", "explode:1"}, `--chaos "explode:1": unknown action "explode"`},
		{[]string{"--nnodes", "2:3", "--chaos", "delete-pod:3@step=5"}, "node rank 3 does not exist: the job has ranks 0 to 2"},
		{[]string{"--nnodes", "2:3", "--nproc-per-node", "2", "--chaos", "kill-worker:1/2"}, "local rank 2 does not exist"},
		{[]string{"--nnodes", "2:3", "--chaos", "oom:1@after=soon"}, `WHEN "after=soon"`},
		{[]string{"--nnodes", "3:2"}, "--nnodes"},
		{[]string{}, "--nnodes MIN:MAX is required"},
		{[]string{"--nnodes", "2", "--launcher", "torchrun"}, `--launcher "torchrun"`},
		{[]string{"--nnodes", "2", "--network", "vpn"}, `--network "vpn"`},
		{[]string{"--nnodes", "2", "--heartbeat-timeout", "1s"}, "--heartbeat-timeout 1s must exceed"},
	} {
		out := filepath.Join(t.TempDir(), "job")
		cmd := newLocalCmd()
		var buf bytes.Buffer
		cmd.SetOut(&buf)
		cmd.SetArgs(append(append(tc.args, "--out", out, "--"), "python3", "train.py"))
		err := cmd.ExecuteContext(t.Context())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.want)
		}
		if _, serr := os.Stat(out); serr == nil || buf.Len() > 0 {
			t.Errorf("%v: something started: %s", tc.args, buf.String())
		}
	}
}
