package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// torchPython is Debian's python3 with torch (scripts/deps.sh apt), not the
// pyenv python3 on PATH.
const torchPython = "/usr/bin/python3"

// TestRootCauseOfRealTorchJob runs three real torch.distributed (gloo)
// workers; rank 1 raises, its peers fail a moment later with "Connection
// closed by peer". Each worker's torch error file becomes a document through
// `kfelastic errors put`, the peers' first; `kfelastic errors` must name rank
// 1's ValueError.
func TestRootCauseOfRealTorchJob(t *testing.T) {
	if testing.Short() {
		t.Skip("real torch workers: skipped under -short")
	}
	if err := testenv.TorchImports(torchPython); err != nil {
		t.Fatalf("%s cannot import torch (%v): run scripts/deps.sh apt", torchPython, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	script, _ := filepath.Abs("../../testdata/train/allreduce_fail.py")
	dir := t.TempDir()
	var cmds []*exec.Cmd
	for r := range 3 {
		cmd := exec.CommandContext(ctx, torchPython, script)
		cmd.Env = append(os.Environ(), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
			"RANK="+strconv.Itoa(r), "WORLD_SIZE=3", "LOCAL_RANK=0", "OMP_NUM_THREADS=1",
			"TORCHELASTIC_ERROR_FILE="+filepath.Join(dir, fmt.Sprintf("error-%d.json", r)))
		var log bytes.Buffer
		cmd.Stdout, cmd.Stderr = &log, &log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for r, cmd := range cmds {
		var ee *exec.ExitError
		if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("rank %d: want exit 1, got %v\n%s", r, err, cmd.Stdout)
		}
	}
	url := "file://" + filepath.Join(dir, "outputs")
	for _, r := range []int{2, 0, 1} {
		// A fresh command each time: cobra keeps the first context it gave
		// a (global) subcommand, which a later run would find canceled.
		put := newErrorsPutCmd()
		put.SetArgs([]string{"--worker", fmt.Sprintf("job-worker-%d", r),
			"--from-torch-error", filepath.Join(dir, fmt.Sprintf("error-%d.json", r)), "--exit-code", "1", url})
		put.SetOut(&bytes.Buffer{})
		if err := put.ExecuteContext(ctx); err != nil {
			t.Fatalf("errors put rank %d: %v", r, err)
		}
	}
	var out bytes.Buffer
	if err := runErrors(ctx, errorsConfig{URL: url, Concurrency: 4}, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	lines := strings.Split(s, "\n")
	if !strings.Contains(lines[1], "job-worker-1") || !strings.Contains(lines[1], "ValueError") || !strings.HasPrefix(lines[1], "*") {
		t.Fatalf("root cause row:\n%s", s)
	}
	if !strings.Contains(s, "ValueError: loss is NaN at step 3 on rank 1\n  Also failed: 2 other workers (2× RuntimeError).") {
		t.Fatalf("UI message:\n%s", s)
	}
}
