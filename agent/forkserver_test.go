package agent

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// needPython skips without /usr/bin/python3 (the fork server's tests that
// need no torch).
func needPython(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("real python: skipped with -short")
	}
	if _, err := os.Stat(python); err != nil {
		t.Skipf("no %s", python)
	}
}

// newTestForkServer starts a real fork server with /usr/bin/python3 and
// preload (none: fast), and waits until it is ready.
func newTestForkServer(t *testing.T, preload string) *forkServer {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := startForkServer(python, os.Environ(), preload, "test/fork", filepath.Join(t.TempDir(), "fork.log"), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	if !s.waitReady(nil) {
		t.Fatalf("fork server not ready: %s", tail(s.logPath, 4096))
	}
	return s
}

// forkScript forks python code as a worker script and returns its pid, its
// end and its stdout (read to EOF) once it ended.
func forkScript(t *testing.T, s *forkServer, code string, args []string, env []string) (int, <-chan forkExit, <-chan string) {
	t.Helper()
	script := filepath.Join(t.TempDir(), "w.py")
	if err := os.WriteFile(script, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	pid, exit, err := s.fork(append([]string{script}, args...), env, w, w)
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	out := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(r)
		r.Close()
		out <- string(b)
	}()
	return pid, exit, out
}

func waitForkExit(t *testing.T, exit <-chan forkExit) forkExit {
	t.Helper()
	select {
	case e := <-exit:
		return e
	case <-time.After(20 * time.Second):
		t.Fatal("no exit reported")
		return forkExit{}
	}
}

// A forked worker gets exactly the environment, argv, working directory
// and sys.path[0] it is given, leads its own process group, and its exit
// status comes back as the wait status.
func TestForkServerWorker(t *testing.T) {
	needPython(t)
	s := newTestForkServer(t, "")
	code := `import json, os, sys
print(json.dumps({"env": dict(os.environ), "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
    "pgid": os.getpgid(0), "pid": os.getpid(), "ppid": os.getppid(), "name": __name__, "file": __file__}))
sys.exit(3)
`
	env := []string{"A=1", "B=two words", "PYTHONUNBUFFERED=1"}
	pid, exit, out := forkScript(t, s, code, []string{"--x", "y"}, env)
	e := waitForkExit(t, exit)
	if e.lost || e.status.Signaled() || e.status.ExitStatus() != 3 {
		t.Errorf("exit %+v (status %v), want exit 3", e, e.status.ExitStatus())
	}
	var got struct {
		Env                    map[string]string
		Argv                   []string
		Path0, Cwd, Name, File string
		PGID, PID, PPID        int
	}
	text := <-out
	if err := json.Unmarshal([]byte(text), &got); err != nil {
		t.Fatalf("worker output %q: %v", text, err)
	}
	if len(got.Env) != 3 || got.Env["A"] != "1" || got.Env["B"] != "two words" {
		t.Errorf("env %v, want exactly %v", got.Env, env)
	}
	wd, _ := os.Getwd()
	if got.PID != pid || got.PGID != pid || got.PPID != s.pid || got.Cwd != wd || got.Name != "__main__" ||
		got.Path0 != filepath.Dir(got.File) || len(got.Argv) != 3 || got.Argv[0] != got.File || got.Argv[1] != "--x" {
		t.Errorf("worker %+v; want pid = pgid = %d, parent the server %d, cwd %s, argv [script --x y]", got, pid, s.pid, wd)
	}
}

// A worker killed by a signal is reported with that signal; a fork server
// that dies takes its workers with it, and they are reported lost.
func TestForkServerSignalAndDeath(t *testing.T) {
	needPython(t)
	s := newTestForkServer(t, "")
	pid, exit, _ := forkScript(t, s, "import time\ntime.sleep(60)\n", nil, []string{"X=1"})
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if e := waitForkExit(t, exit); e.lost || !e.status.Signaled() || e.status.Signal() != syscall.SIGKILL {
		t.Errorf("exit %+v, want SIGKILL", e)
	}
	pid, exit, _ = forkScript(t, s, "import time\ntime.sleep(60)\n", nil, []string{"X=1"})
	_ = syscall.Kill(s.pid, syscall.SIGKILL)
	if e := waitForkExit(t, exit); !e.lost {
		t.Errorf("exit %+v, want lost", e)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(pid) {
		t.Errorf("worker %d outlived its fork server", pid)
	}
	if _, _, err := s.fork([]string{"x.py"}, nil, os.Stdout, os.Stdout); err == nil || !strings.Contains(err.Error(), "died") {
		t.Errorf("fork from a dead server: %v", err)
	}
}
