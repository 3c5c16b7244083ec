package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/shmsem"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// buildBinary builds this command once per test binary run.
var buildBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kfelastic-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kfelastic")
	out, err := testenv.StaticBuild(context.Background(), bin, "./cmd/kfelastic").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// proc is a started kfelastic process whose output the test reads. One
// goroutine waits for it (exec.Cmd.Wait may be called once): the others
// read exited and waitErr.
type proc struct {
	cmd *exec.Cmd
	out *lockedBuffer
	// exited is closed once the process has been waited for; waitErr is
	// then Wait's error.
	exited  chan struct{}
	waitErr error
}

// wait waits for the process to exit and returns Wait's error.
func (p *proc) wait() error {
	<-p.exited
	return p.waitErr
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startProc(t *testing.T, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), out: &lockedBuffer{}, exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { _ = p.killGroup() })
	return p
}

// killGroup SIGKILLs the process's group and every process below it (a
// pod whose machine died: the agent starts its command in a group of its
// own) and waits for them; then it unlinks the POSIX semaphores they had
// mapped: their Python resource tracker, killed with them, cannot (a
// Kubernetes pod's /dev/shm would go with the pod; these share the
// machine's).
func (p *proc) killGroup() error {
	pgid := p.cmd.Process.Pid
	select {
	case <-p.exited:
		// Waited for already: its pid may be another process's now, so
		// only its group's leftovers are killed, as before.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		return nil
	default:
	}
	pids := append(shmsem.Tree(pgid), shmsem.Group(pgid)...)
	sems := shmsem.Mapped(pids)
	err := syscall.Kill(-pgid, syscall.SIGKILL)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = p.wait()
	alive := func() bool {
		for _, pid := range pids {
			if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(st), ") Z ") {
				return true
			}
		}
		return false
	}
	for end := time.Now().Add(5 * time.Second); alive() && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	shmsem.Unlink(sems)
	return err
}

func (p *proc) waitFor(t *testing.T, re *regexp.Regexp, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !re.MatchString(p.out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q within %v in:\n%s", re, d, p.out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The issue's real-process test: `kfelastic master` and three `kfelastic
// agent --nnodes 2:3` over real torch workers. The round completes with 2;
// the third joins, and all restart into a round of 3 with group_world_size=3
// and restart_count unchanged (a membership change spends no budget), then
// train to the end from the checkpoint.
func TestMasterScaleUpRealTorch(t *testing.T) {
	bin := torchBinary(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	_ = os.WriteFile(tokenFile, []byte("job-token\n"), 0o600)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	m := startProc(t, nil, bin, "master", "--listen", addr, "--nnodes", "2:3", "--rdzv-id", "scale", "--token-file", tokenFile,
		"--state", "file://"+filepath.Join(dir, "state"), "--waiting-timeout", "1s", "--heartbeat-interval", "1s",
		"--heartbeat-timeout", "10s")
	script, _ := filepath.Abs("../../agent/testdata/train/train_steps.py")
	ckpt := filepath.Join(dir, "ckpt")
	agent := func(rank int) *proc {
		return startProc(t, []string{fmt.Sprintf("POD_NAME=scale-worker-%d", rank), "OMP_NUM_THREADS=1"}, bin, "agent", "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
			"--rdzv-endpoint", addr, "--rdzv-id", "scale", "--token-file", tokenFile, "--node-rank", fmt.Sprint(rank),
			"--max-restarts", "0", "--master-addr", "127.0.0.1", "--error-prefix", "file://"+filepath.Join(dir, "out"),
			"--", torchPython, script, "--steps", "300", "--sleep", "0.03", "--ckpt", ckpt)
	}
	a0, a1 := agent(0), agent(1)
	two := regexp.MustCompile(`(?s)restart_count=0.*group_world_size=2`)
	a0.waitFor(t, two, 60*time.Second)
	a1.waitFor(t, two, 60*time.Second)
	a0.waitFor(t, regexp.MustCompile(`\[default0\]:step 20 `), 60*time.Second)
	a2 := agent(2)
	three := regexp.MustCompile(`(?s)restart_count=0\s+master_addr=\S+\s+master_port=\d+\s+group_rank=\d\s+group_world_size=3`)
	for _, a := range []*proc{a0, a1, a2} {
		a.waitFor(t, three, 60*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for i, a := range []*proc{a0, a1, a2} {
		select {
		case <-a.exited:
			if err := a.waitErr; err != nil {
				t.Errorf("agent %d: %v\n%s", i, err, a.out)
			}
		case <-ctx.Done():
			t.Fatalf("agent %d did not finish:\n%s", i, a.out)
		}
	}
	s0 := a0.out.String()
	if strings.Contains(s0, "restart_count=1") {
		t.Errorf("the scale-up spent restart budget:\n%s", s0)
	}
	if !strings.Contains(s0, "[default0]:step 299 ") {
		t.Errorf("training did not reach its last step:\n%s", s0)
	}
	if !strings.Contains(m.out.String(), "rendezvous round completed") {
		t.Errorf("master log:\n%s", m.out)
	}
}

// forEachTorch runs f as a subtest per torch here (torch1.13, torch2.14;
// testenv.Torches), py its interpreter; skipped with -short.
func forEachTorch(t *testing.T, f func(t *testing.T, py string)) {
	t.Helper()
	if testing.Short() {
		t.Skip("real master, agents and torch workers")
	}
	testenv.ForEachTorch(t, func(t *testing.T, tc testenv.Torch) { f(t, tc.Python) })
}

// onTorch runs f on one torch, prefer when it is here (testenv.OnTorch),
// py its interpreter; skipped with -short.
func onTorch(t *testing.T, prefer string, f func(t *testing.T, py string)) {
	t.Helper()
	if testing.Short() {
		t.Skip("real master, agents and torch workers")
	}
	testenv.OnTorch(t, prefer, func(t *testing.T, tc testenv.Torch) { f(t, tc.Python) })
}

// torchBinary skips the test with -short, fails it without torch, and
// returns the built kfelastic binary.
func torchBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("real master, agents and torch workers")
	}
	if err := testenv.TorchImports(torchPython); err != nil {
		t.Fatalf("%s cannot import torch (%v): run scripts/deps.sh apt", torchPython, err)
	}
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}
