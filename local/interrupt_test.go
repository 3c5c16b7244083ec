package local

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Ctrl-C (SIGINT to `kfelastic local`) stops every process the job
// started: agents, their guardians, workers; none is left once the command
// returns. Processes are found by the pod name every one of them inherits.
func TestInterruptLeavesNoProcess(t *testing.T) {
	cmd, buf := startTraining(t, "ctrlc")
	start := time.Now()
	_ = cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	t.Logf("stopped in %s", time.Since(start).Round(time.Millisecond))
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("exit %d (%v) after Ctrl-C, want 130 (128+SIGINT)", code, err)
	}
	if left := jobProcesses("ctrlc-worker-"); len(left) > 0 {
		t.Fatalf("processes left after Ctrl-C: %v\n%s", left, buf.String())
	}
	if !strings.Contains(buf.String(), "interrupted") || !strings.Contains(buf.String(), "Report: ") {
		t.Errorf("output:\n%s", buf.String())
	}
}

// A SIGKILLed `kfelastic local` cannot stop its pods in order: they die
// with it (the pods' parent-death signal, and the agents' for their
// workers), and nothing of the job trains on without a master.
func TestKilledEngineLeavesNoProcess(t *testing.T) {
	cmd, buf := startTraining(t, "killed")
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := jobProcesses("killed-worker-")
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			t.Fatalf("processes left 10 s after the engine was SIGKILLed: %v\n%s", left, buf.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startTraining starts `kfelastic local` with two pods of two workers, job
// name job, and returns once both pods train.
func startTraining(t *testing.T, job string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	bin := kfelasticBinary(t)
	needTorchAt(t, python)
	out := t.TempDir()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "examples", "train", "train.py")
	buf := &syncBuffer{}
	cmd := exec.Command(bin, "local", "--nnodes", "2:2", "--nproc-per-node", "2", "--job", job, "--out", out, "--grace", "3s",
		"--", python, script, "--steps", "100000", "--sleep", "0.05")
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for !trained(out, job+"-worker-1") || !trained(out, job+"-worker-0") {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("no training step in 90 s:\n%s", buf.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := len(jobProcesses(job + "-worker-")); n < 6 {
		t.Fatalf("only %d processes of the job found (want agents and 4 workers)", n)
	}
	return cmd, buf
}

func trained(out, pod string) bool {
	b, _ := os.ReadFile(filepath.Join(out, "pods", pod+".log"))
	return bytes.Contains(b, []byte("step = 1"))
}

// jobProcesses lists the live processes whose environment names a pod
// with this prefix.
func jobProcesses(prefix string) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); bytes.Contains(stat, []byte(") Z ")) {
			continue // a zombie holds nothing and is its parent's to reap
		}
		if env := environ(pid); strings.HasPrefix(env["POD_NAME"], prefix) {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			out = append(out, e.Name()+" "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}

// Issue 30: a stop reaches a job still starting its pods. The engine starts
// pods one at a time; a job of many pods interrupted while it starts them
// used to start every one before it heard the stop, and only then stop
// them. A run whose context has ended starts none, and says so once.
func TestInterruptedJobStartsNoPod(t *testing.T) {
	out := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	view := &syncBuffer{}
	res, err := Run(ctx, Options{Job: "stopped", MinNodes: 8, MaxNodes: 8, NProcPerNode: 1, Out: out, View: view,
		Binary: "/bin/true", Command: []string{"/bin/true"}, Grace: time.Second})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want the context's end", err)
	}
	if logs, _ := filepath.Glob(filepath.Join(out, "pods", "*.log")); len(logs) > 0 {
		t.Errorf("pods started after the stop: %v", logs)
	}
	if !strings.Contains(view.String(), "interrupted: 8 pods not started") {
		t.Errorf("view does not say the pods were not started:\n%s", view.String())
	}
	if res == nil {
		t.Fatal("no result")
	}
}
