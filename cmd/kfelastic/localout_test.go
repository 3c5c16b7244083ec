package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/local"
)

// runLocalProcess runs `kfelastic local` in dir and returns its output
// and exit code.
func runLocalProcess(t *testing.T, bin, dir string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"local"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("kfelastic local %q still ran after 2 minutes:\n%s", args, out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// Two `kfelastic local` jobs started at the same instant get a folder each
// (they shared out/local-YYYYMMDD-HHMMSS, token, state and documents: one
// job's agents were refused, the other showed its failure as its own); a
// folder that holds an earlier job is refused, not replayed (the new master
// reloaded the old stopped state and printed the old root cause); an empty
// one is taken.
func TestLocalJobsNeverShareAFolder(t *testing.T) {
	bin := shortBinary(t)
	cwd := t.TempDir()
	outs := make([]string, 2)
	codes := make([]int, 2)
	var wg sync.WaitGroup
	for i := range outs {
		// The second fails for good: were its folder the first's, the
		// first would show its failure as its own.
		script := []string{"true"}
		if i == 1 {
			script = []string{"sh", "-c", "echo job-two-failed >&2; exit 3"}
		}
		wg.Go(func() {
			outs[i], codes[i] = runLocalProcess(t, bin, cwd, append([]string{"--nnodes", "1", "--max-restarts", "0", "--"}, script...)...)
		})
	}
	wg.Wait()
	folders, _ := filepath.Glob(filepath.Join(cwd, "out", "local-*"))
	if len(folders) != 2 {
		t.Fatalf("folders %q, want 2\n%s\n%s", folders, outs[0], outs[1])
	}
	if codes[0] != 0 || codes[1] != 1 || strings.Contains(outs[0], "job-two-failed") {
		t.Errorf("exit codes %v, want [0 1]:\n%s\n%s", codes, outs[0], outs[1])
	}
	t.Logf("folders: %s, %s", filepath.Base(folders[0]), filepath.Base(folders[1]))

	// Reused: refused, and the earlier job's folder is left as it was.
	old := folders[0]
	before, _ := os.ReadDir(filepath.Join(old, "pods"))
	out, code := runLocalProcess(t, bin, cwd, "--nnodes", "1", "--out", old, "--", "true")
	if code == 0 || !strings.Contains(out, "holds an earlier job (state/)") || !strings.Contains(out, "give another --out") {
		t.Errorf("reused --out: exit %d:\n%s", code, out)
	}
	if after, _ := os.ReadDir(filepath.Join(old, "pods")); len(after) != len(before) {
		t.Errorf("the refused job wrote into the earlier job's folder: %v → %v", before, after)
	}
	other := filepath.Join(cwd, "mine")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := runLocalProcess(t, bin, cwd, "--nnodes", "1", "--out", other, "--", "true"); code == 0 || !strings.Contains(out, "is not empty") {
		t.Errorf("a folder with a file: exit %d:\n%s", code, out)
	}
	empty := t.TempDir()
	if out, code := runLocalProcess(t, bin, cwd, "--nnodes", "1", "--out", empty, "--", "true"); code != 0 {
		t.Errorf("an empty folder: exit %d:\n%s", code, out)
	}
}

// NewOutFolder never returns a folder twice, however many ask at once.
func TestNewOutFolderUnique(t *testing.T) {
	base := filepath.Join(t.TempDir(), "out", "job-20260101-000000")
	names := make([]string, 8)
	var wg sync.WaitGroup
	for i := range names {
		wg.Go(func() {
			var err error
			if names[i], err = local.NewOutFolder(base); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Errorf("%s given twice: %q", n, names)
		}
		seen[n] = true
	}
	if !seen[base] || !seen[base+"-8"] {
		t.Errorf("names %q, want %s to %s-8", names, base, base)
	}
}

// A script that does not exist fails the job at once, on its first
// attempt, and the root cause names it (it ended as NonZeroExit after 4
// attempts, the file unnamed). A restart cannot make the file appear.
func TestLocalMissingScriptSaysSo(t *testing.T) {
	bin := shortBinary(t)
	cwd := t.TempDir()
	out, code := runLocalProcess(t, bin, cwd, "--nnodes", "1", "--max-restarts", "3", "--out", filepath.Join(cwd, "job"),
		"--", "python3", "no/such/train.py", "--steps", "5")
	if code != 1 || !strings.Contains(out, `StartFailed: python3 cannot open its script "no/such/train.py": no such file or directory (working directory `+cwd+")") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	log, err := os.ReadFile(filepath.Join(cwd, "job", "pods", "local-worker-0.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "Rendezvous complete for workers"); n != 1 {
		t.Errorf("%d attempts, want 1:\n%s", n, log)
	}
}

// Ctrl-C (SIGINT) of `kfelastic local` exits 130, as a shell reports a
// command SIGINT ended, not 1 (a failed job); SIGTERM 143.
func TestLocalInterruptedExitStatus(t *testing.T) {
	bin := shortBinary(t)
	for sig, want := range map[syscall.Signal]int{syscall.SIGINT: 130, syscall.SIGTERM: 143} {
		dir := filepath.Join(t.TempDir(), "job")
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, bin, "local", "--nnodes", "1", "--grace", "1s", "--out", dir, "--", "sleep", "600")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for {
			b, _ := os.ReadFile(filepath.Join(dir, "pods", "local-worker-0.log"))
			if strings.Contains(string(b), "workers started") {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("the pod did not start:\n%s", b)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = cmd.Process.Signal(sig)
		err := cmd.Wait()
		cancel()
		if code := cmd.ProcessState.ExitCode(); code != want {
			t.Errorf("%v: exit %d (%v), want %d:\n%s", sig, code, err, want, out.String())
		}
	}
}
