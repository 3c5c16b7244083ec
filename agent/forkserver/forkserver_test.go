package forkserver

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// The fork server's tests run real interpreters: Debian's Python 3
// (testenv.SystemPython) and, per torch, torch 1.13's and 2.14's where
// scripts/deps.sh built them (testenv.ForEachTorch).

// newTestForkServer starts a real fork server with py and preload (none:
// fast), and waits until it is ready.
func newTestForkServer(t *testing.T, py, preload string, env ...string) *Server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := Start(py, append(os.Environ(), env...), preload, filepath.Join(t.TempDir(), "fork.log"), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if !s.WaitReady(nil) {
		t.Fatalf("fork server not ready: %s", s.LogTail(4096))
	}
	return s
}

// `python SCRIPT ARGS` (a relative path) and `python -m MODULE ARGS`
// forked are as exec'd: sys.argv, sys.path[0], __name__, __file__,
// __loader__, __spec__, and the real __main__ module as the globals.
func TestForkServerAsExeced(t *testing.T) {
	testenv.NeedPython(t)
	testenv.ForEachTorch(t, forkServerAsExeced)
}

func forkServerAsExeced(t *testing.T, tc testenv.Torch) {
	py := tc.Python
	code := `import json, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "file": __file__, "spec": __spec__ and __spec__.name,
    "loader": type(__loader__).__name__, "main": sys.modules["__main__"].__dict__ is globals(), "doc": __doc__}))
`
	script := testenv.TempFile(t, "kfmod.py", `"""doc"""`+"\n"+code)
	dir := filepath.Dir(script)
	wd, _ := os.Getwd()
	rel, err := filepath.Rel(wd, script)
	if err != nil {
		t.Fatal(err)
	}
	s := newTestForkServer(t, py, "", "PYTHONPATH="+dir)
	for _, argv := range [][]string{{rel, "a", "-b"}, {"-m", "kfmod", "a", "-b"}} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		_, exit, err := s.Fork(argv, map[string]string{"PYTHONPATH": dir}, w, w)
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		forked, _ := io.ReadAll(r)
		r.Close()
		if e := waitForkExit(t, exit); e.Lost || e.Status.ExitStatus() != 0 {
			t.Errorf("%q: exit %+v: %s", argv, e, forked)
		}
		cmd := exec.Command(py, argv...)
		cmd.Env = []string{"PYTHONPATH=" + dir}
		execd, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		if string(forked) != string(execd) || !strings.Contains(string(forked), `"name": "__main__"`) {
			t.Errorf("%q:\nforked  %s\nexec'd  %s", argv, forked, execd)
		}
	}
}

// forkScript forks python code as a worker script and returns its pid, its
// end and its stdout (read to EOF) once it ended.
func forkScript(t *testing.T, s *Server, code string, args []string, env map[string]string) (int, <-chan End, <-chan string) {
	t.Helper()
	script := testenv.TempFile(t, "w.py", code)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	pid, exit, err := s.Fork(append([]string{script}, args...), env, w, w)
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

func waitForkExit(t *testing.T, exit <-chan End) End {
	t.Helper()
	select {
	case e := <-exit:
		return e
	case <-time.After(20 * time.Second):
		t.Fatal("no exit reported")
		return End{}
	}
}

// A forked worker gets exactly the environment, argv, working directory
// and sys.path[0] it is given, leads its own process group, and its exit
// status comes back as the wait status.
func TestForkServerWorker(t *testing.T) {
	testenv.NeedPython(t)
	testenv.ForEachTorch(t, forkServerWorker)
}

func forkServerWorker(t *testing.T, tc testenv.Torch) {
	py := tc.Python
	s := newTestForkServer(t, py, "")
	code := `import json, os, sys
proc = [kv for kv in open("/proc/self/environ").read().split("\0") if kv]
print(json.dumps({"env": dict(os.environ), "proc": proc, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
    "pgid": os.getpgid(0), "pid": os.getpid(), "ppid": os.getppid(), "name": __name__, "file": __file__}))
sys.exit(3)
`
	env := []string{"A=1", "B=two words", "PYTHONUNBUFFERED=1"}
	pid, exit, out := forkScript(t, s, code, []string{"--x", "y"}, map[string]string{"A": "1", "B": "two words", "PYTHONUNBUFFERED": "1"})
	e := waitForkExit(t, exit)
	if e.Lost || e.Status.Signaled() || e.Status.ExitStatus() != 3 {
		t.Errorf("exit %+v (status %v), want exit 3", e, e.Status.ExitStatus())
	}
	var got struct {
		Env                    map[string]string
		Proc                   []string
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
	// What others read of it too (the agent's sweep, tools that look for
	// LOCAL_RANK): not the server's.
	if slices.Sort(got.Proc); !slices.Equal(got.Proc, env) {
		t.Errorf("/proc/PID/environ %q, want %q", got.Proc, env)
	}
	wd, _ := os.Getwd()
	if got.PID != pid || got.PGID != pid || got.PPID != s.Pid() || got.Cwd != wd || got.Name != "__main__" ||
		got.Path0 != filepath.Dir(got.File) || len(got.Argv) != 3 || got.Argv[0] != got.File || got.Argv[1] != "--x" {
		t.Errorf("worker %+v; want pid = pgid = %d, parent the server %d, cwd %s, argv [script --x y]", got, pid, s.Pid(), wd)
	}
}

// A worker killed by a signal is reported with that signal; a fork server
// that dies takes its workers with it, and they are reported lost.
func TestForkServerSignalAndDeath(t *testing.T) {
	testenv.NeedPython(t)
	testenv.ForEachTorch(t, forkServerSignalAndDeath)
}

func forkServerSignalAndDeath(t *testing.T, tc testenv.Torch) {
	py := tc.Python
	s := newTestForkServer(t, py, "")
	pid, exit, _ := forkScript(t, s, "import time\ntime.sleep(60)\n", nil, map[string]string{"X": "1"})
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if e := waitForkExit(t, exit); e.Lost || !e.Status.Signaled() || e.Status.Signal() != syscall.SIGKILL {
		t.Errorf("exit %+v, want SIGKILL", e)
	}
	pid, exit, _ = forkScript(t, s, "import time\ntime.sleep(60)\n", nil, map[string]string{"X": "1"})
	_ = syscall.Kill(s.Pid(), syscall.SIGKILL)
	if e := waitForkExit(t, exit); !e.Lost {
		t.Errorf("exit %+v, want lost", e)
	}
	deadline := time.Now().Add(5 * time.Second)
	for testenv.Alive(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if testenv.Alive(pid) {
		t.Errorf("worker %d outlived its fork server", pid)
	}
	if _, _, err := s.Fork([]string{"x.py"}, nil, os.Stdout, os.Stdout); err == nil || !strings.Contains(err.Error(), "died") {
		t.Errorf("fork from a dead server: %v", err)
	}
}

// A fork server in which a preload started a thread refuses to fork (the
// child would inherit the other thread's locks, held, without the thread),
// and keeps refusing; the agent then execs.
func TestForkServerRefusesWithThreads(t *testing.T) {
	testenv.NeedPython(t)
	dir := filepath.Dir(testenv.TempFile(t, "kfthread.py", "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"))
	s := newTestForkServer(t, testenv.SystemPython, "kfthread", "PYTHONPATH="+dir)
	for range 2 {
		_, _, err := s.Fork([]string{"x.py"}, nil, os.Stdout, os.Stdout)
		if err == nil || !strings.Contains(err.Error(), "threads") || s.Refused() == "" {
			t.Errorf("fork with a thread running: %v (refused: %q)", err, s.Refused())
		}
	}
}
