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
	notExecutable := filepath.Join(t.TempDir(), "kfelastic")
	if err := os.WriteFile(notExecutable, []byte("not a program"), 0o644); err != nil {
		t.Fatal(err)
	}
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
		{[]string{"--nnodes", "2", "--job", "my job/x"}, `--job "my job/x": pods are named <job>-worker-<i>, so the job's name must be a DNS label`},
		{[]string{"--nnodes", "2", "--job", "Big"}, `--job "Big"`},
		{[]string{"--nnodes", "2", "--job", strings.Repeat("j", 60)}, "would be longer than 63 characters"},
		{[]string{"--nnodes", "2", "--binary", "/nonexistent/kfelastic"}, "--binary: stat /nonexistent/kfelastic: no such file or directory"},
		{[]string{"--nnodes", "2", "--binary", notExecutable}, "--binary: " + notExecutable + ": not executable"},
		{[]string{"--nnodes", "2", "--binary", "/usr"}, "--binary: /usr: not a regular file"},
		{[]string{"--nnodes", "1000"}, "1000 workers (MAX pods × workers per pod) is more than this machine holds"},
		{[]string{"--nnodes", "1000"}, "or set --max-workers 1000 to run it anyway"},
		{[]string{"--nnodes", "2:3", "--nproc-per-node", "4", "--max-workers", "8"}, "at most 8 (--max-workers)"},
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
