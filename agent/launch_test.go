package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/agent/guardian"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// How the agent starts its workers (launch.go), through Run: the fork
// server's restarts, refusals and deaths, and what is exec'd instead. The
// fork server itself is tested in agent/forkserver.

// The fork server on real torch workers: a kill -9 of a worker restarts the
// group from the fork server with the worker environment a cold worker gets
// (only the per-attempt values differ), the same argv, each worker leading
// its own process group as the server's child; a killed fork server takes
// its workers with it, the group restarts with exec while a new server
// imports, and the restart after that is forked again; training resumes to
// the end each time.
func TestTorchForkServerRestarts(t *testing.T) {
	forEachTorch(t, torchForkServerRestarts)
}

func torchForkServerRestarts(t *testing.T, py string) {
	dir, ckpt := t.TempDir(), filepath.Join(t.TempDir(), "ckpt")
	cfg, out := torchConfig(t, py, 2, "--steps", "100", "--sleep", "0.02", "--ckpt", ckpt, "--env-out", dir)
	cfg.MaxRestarts, cfg.Env = 3, cleanEnv()
	done := make(chan error, 1)
	go func() { done <- Run(t.Context(), cfg) }()
	servers := regexp.MustCompile(`msg="fork server starting" pid=(\d+)`)
	kill := func(restart int, what string) {
		t.Helper()
		waitFor(t, out, fmt.Sprintf("[default1]:restart %d pid", restart), 30*time.Second)
		var pid int
		if what == "server" {
			m := servers.FindAllStringSubmatch(out.String(), -1)
			pid, _ = strconv.Atoi(m[len(m)-1][1])
		} else {
			pid = readProc(t, dir, restart, 1)["pid"]
		}
		time.Sleep(300 * time.Millisecond) // a few steps
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %s %d: %v", what, pid, err)
		}
	}
	kill(0, "worker")
	kill(1, "server")
	kill(2, "worker")
	if err := <-done; err != nil {
		t.Fatalf("Run: %v\n%s", err, out)
	}
	s := out.String()
	if !strings.Contains(s, "[default1]:restart 3 pid") || !strings.Contains(s, "[default1]:step 99 ") {
		t.Fatalf("training did not resume to step 99 after 3 restarts:\n%s", s)
	}
	ms := servers.FindAllStringSubmatch(s, -1)
	if len(ms) != 2 || !strings.Contains(s, `msg="fork server died`) {
		t.Fatalf("want a second fork server after the first died:\n%s", s)
	}
	server := []string{ms[0][1], ms[0][1], "", ms[1][1]} // restart 2 is exec'd: no server yet
	perAttempt := []string{"MASTER_PORT", "TORCHELASTIC_ERROR_FILE", ProgressFileEnv, "TORCHELASTIC_RESTART_COUNT", guardian.MarkEnv}
	pgids := map[int]bool{}
	for restart := range 4 {
		for rank := range 2 {
			env := readEnv(t, dir, restart, rank)
			if env["TORCHELASTIC_RESTART_COUNT"] != strconv.Itoa(restart) {
				t.Errorf("restart %d rank %d: TORCHELASTIC_RESTART_COUNT %q", restart, rank, env["TORCHELASTIC_RESTART_COUNT"])
			}
			cold := readEnv(t, dir, 2, rank)
			for _, k := range sortedKeys(cold, env) {
				if !slices.Contains(perAttempt, k) && cold[k] != env[k] {
					t.Errorf("rank %d: %s: exec'd %q, restart %d %q", rank, k, cold[k], restart, env[k])
				}
			}
			if a, b := readArgv(t, dir, restart, rank), readArgv(t, dir, 2, rank); fmt.Sprint(a) != fmt.Sprint(b) {
				t.Errorf("rank %d: exec'd %v, restart %d %v", rank, b, restart, a)
			}
			p := readProc(t, dir, restart, rank)
			forked := server[restart] != ""
			parent := strconv.Itoa(os.Getpid())
			if forked {
				parent = server[restart]
			}
			preloaded, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("preloaded-%d-%d", restart, rank)))
			if p["pgid"] != p["pid"] || strconv.Itoa(p["ppid"]) != parent || string(preloaded) != map[bool]string{true: "True", false: "False"}[forked] {
				t.Errorf("restart %d rank %d: %v, torch preloaded %s; want its own process group, parent %s, forked %t",
					restart, rank, p, preloaded, parent, forked)
			}
			pgids[p["pgid"]] = true
		}
	}
	t.Logf("%s", regexp.MustCompile(`(?m)^time=.*$`).FindAllString(s, -1))
	if len(pgids) != 8 {
		t.Errorf("%d process groups for 8 workers", len(pgids))
	}
}

func readProc(t *testing.T, dir string, restart, rank int) map[string]int {
	return decodeFile[map[string]int](t, filepath.Join(dir, fmt.Sprintf("proc-%d-%d.json", restart, rank)))
}

// familyScript is a python worker that leaves what a real one may: a
// forked child in a session of its own (it carries the fork server's mark,
// not the attempt's), an exec'd daemon in another, and a multiprocessing
// child by the default start method (a data loader's): fork up to Python
// 3.13; forkserver from 3.14, which starts multiprocessing's own server
// process (an interpreter exec'd with the worker's environment) that forks
// the child and outlives it. It writes the pids to
// DIR/{worker,forked,daemon,mp,mpserver}-<restart>-<local rank> (mpserver
// is the mp child again where there is no such server) and sleeps.
const familyScript = `import multiprocessing, os, subprocess, sys, time

def idle():
    time.sleep(600)

if __name__ == "__main__":
    d, r = sys.argv[1], os.environ["TORCHELASTIC_RESTART_COUNT"] + "-" + os.environ["LOCAL_RANK"]
    def note(name, pid):
        with open(os.path.join(d, f".{name}-{r}"), "w") as f:
            f.write(str(pid))
        os.replace(os.path.join(d, f".{name}-{r}"), os.path.join(d, f"{name}-{r}"))
    pid = os.fork()
    if pid == 0:
        os.setsid()
        time.sleep(600)
        os._exit(0)
    note("forked", pid)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    note("daemon", p.pid)
    mp = multiprocessing.Process(target=idle)
    mp.start()
    note("mp", mp.pid)
    server = None
    if multiprocessing.get_start_method() == "forkserver":
        from multiprocessing import forkserver
        server = forkserver._forkserver._forkserver_pid
    note("mpserver", server or mp.pid)
    note("worker", os.getpid())
    time.sleep(600)
`

// familyPids is how many pids familyScript notes per worker.
const familyPids = 5

// Nothing outlives an agent whose workers were forked: not the workers, not
// what they forked or started out of their process groups, not the fork
// server; whether the agent is SIGTERMed (it stops and sweeps) or SIGKILLed
// (its guardian does). Nothing of an attempt outlives it either, but the
// fork server, which forks the next.
func TestForkServerNoOrphans(t *testing.T) {
	forEachTorch(t, forkServerNoOrphans)
}

func forkServerNoOrphans(t *testing.T, py string) {
	for _, c := range []struct {
		sig     syscall.Signal
		restart bool
	}{{syscall.SIGTERM, false}, {syscall.SIGKILL, false}, {syscall.SIGTERM, true}} {
		sig := c.sig
		t.Run(fmt.Sprintf("%s restart=%t", sig, c.restart), func(t *testing.T) {
			script, logDir := testenv.TempFile(t, "family.py", familyScript), t.TempDir()
			dir := filepath.Dir(script)
			out := &syncBuffer{}
			cmd := startAgentProcess(t, agentProcess{NProc: 2, StopGrace: time.Second, LogDir: logDir, MaxRestarts: 1,
				Command: []string{py, script, dir}}, out, out)
			pids := pidsIn(t, filepath.Join(dir, "*-0-*"), 2*familyPids)
			m := regexp.MustCompile(`msg="fork server starting" pid=(\d+)`).FindStringSubmatch(out.String())
			if m == nil {
				t.Fatalf("no fork server:\n%s", out)
			}
			server, _ := strconv.Atoi(m[1])
			for _, w := range pidsIn(t, filepath.Join(dir, "worker-0-*"), 2) {
				if ppid := parentOf(w); ppid != server {
					t.Errorf("worker %d: parent %d, want the fork server %d", w, ppid, server)
				}
			}
			if c.restart {
				_ = syscall.Kill(pidsIn(t, filepath.Join(dir, "worker-0-1"), 1)[0], syscall.SIGKILL)
				next := pidsIn(t, filepath.Join(dir, "*-1-*"), 2*familyPids)
				waitDead(t, pids, 3*time.Second, "after the first attempt ended")
				if !testenv.Alive(server) {
					t.Fatalf("the fork server %d did not survive the first attempt's end", server)
				}
				for _, w := range pidsIn(t, filepath.Join(dir, "worker-1-*"), 2) {
					if ppid := parentOf(w); ppid != server {
						t.Errorf("restarted worker %d: parent %d, want the fork server %d", w, ppid, server)
					}
				}
				pids = next
			}
			_ = cmd.Process.Signal(sig)
			waitExit(t, cmd, 10*time.Second)
			waitDead(t, append(pids, server), 3*time.Second, "after "+sig.String()+" of the agent")
		})
	}
}

// parentOf is a process's parent pid, 0 if unknown.
func parentOf(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// Only `python SCRIPT` and `python -m MODULE` commands are forked; others
// are exec'd.
func TestForkable(t *testing.T) {
	for _, c := range []struct {
		cmd  []string
		want bool
	}{
		{[]string{"python3", "train.py", "--lr", "1"}, true},
		{[]string{"/usr/bin/python3.11", "-m", "pkg.train", "-x"}, true},
		{[]string{"python", "train.py"}, true},
		{[]string{"python3"}, false},
		{[]string{"python3", "-u", "train.py"}, false},
		{[]string{"python3", "-m"}, false},
		{[]string{"python3", "-c", "print(1)"}, false},
		{[]string{"python3", "-m", "-x"}, false},
		{[]string{"sh", "-c", "python3 train.py"}, false},
		{[]string{"pyflyte-execute", "--task-module", "m"}, false},
		{[]string{"pythonista", "train.py"}, false},
	} {
		if got := forkable(c.cmd); got != c.want {
			t.Errorf("forkable(%q) = %t, want %t", c.cmd, got, c.want)
		}
	}
}

// Commands the fork server cannot stand in for are exec'd: no fork server
// is started for them.
func TestNotForkableIsExeced(t *testing.T) {
	testenv.NeedPython(t)
	helper, out := helperConfig(t, 2, "ok")
	script, outScript := helperConfig(t, 1, "")
	script.Command = []string{python, "-c", "print('hello from -c')"}
	for _, c := range []struct {
		cfg  Config
		out  *syncBuffer
		want string
	}{{helper, out, "[default1]:helper ok rank 1"}, {script, outScript, "[default0]:hello from -c"}} {
		if ee, _ := runAgent(t, t.Context(), c.cfg); ee != nil {
			t.Fatalf("Run: %v\n%s", ee, c.out)
		}
		if s := c.out.String(); !strings.Contains(s, c.want) || strings.Contains(s, "fork server") {
			t.Errorf("%q: want %q and no fork server:\n%s", c.cfg.Command, c.want, s)
		}
	}
}

// Forked workers are classified as exec'd ones: a signal that kills one is
// its failure and exit code; one that hangs is found by the watchdog and
// its process group killed; an exception in @record is its document's
// code.
func TestForkedWorkersClassified(t *testing.T) {
	testenv.NeedPython(t)
	for _, c := range []struct {
		name, code string
		hang       time.Duration
		exit       int
		failure    string
	}{
		{"segv", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", 0, 139, "SignalSIGSEGV"},
		{"hang", "import os, time\nprint('up', flush=True)\nif os.environ['LOCAL_RANK'] == '0':\n    time.sleep(600)\n" +
			"while True:\n    print('alive', flush=True)\n    time.sleep(0.1)\n", 700 * time.Millisecond, kferrors.ExitHang, "Hang"},
		{"raise", "from torch.distributed.elastic.multiprocessing.errors import record\n@record\ndef main():\n    raise KeyError('k')\nmain()\n",
			0, 1, "KeyError"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, out := helperConfig(t, 2, "")
			cfg.Command, cfg.HangTimeout = []string{python, testenv.TempFile(t, "w.py", c.code)}, c.hang
			if !strings.Contains(c.code, "torch") {
				cfg.Preload = "json" // a fast fork server
			}
			ee, _ := runAgent(t, t.Context(), cfg)
			if ee == nil || ee.Code != c.exit || ee.Failure.Code != c.failure || !strings.Contains(out.String(), `msg="fork server ready"`) {
				t.Fatalf("want %s exit %d from forked workers, got %+v\n%s", c.failure, c.exit, ee, out)
			}
		})
	}
}

// A fork server that refuses to fork (a preload started a thread) costs
// nothing but a warning: that attempt's workers are exec'd, the server is
// given up, and the next attempts are exec'd too.
func TestForkServerRefusalFallsBackToExec(t *testing.T) {
	testenv.NeedPython(t)
	threaded := testenv.TempFile(t, "kfthread.py", "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
	// Each worker notes whether it was forked (the server's preload is in
	// its modules); rank 0 of the first attempt fails once rank 1 noted.
	marks := t.TempDir()
	cfg, out := helperConfig(t, 2, "")
	cfg.Command = []string{python, testenv.TempFile(t, "w.py", `import os, sys, time
d, c, r = sys.argv[1], os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["LOCAL_RANK"]
open(os.path.join(d, c + "-" + r + "-" + ("forked" if "kfthread" in sys.modules else "execd")), "w").close()
if c == "0" and r == "0":
    while not any(n.startswith("0-1-") for n in os.listdir(d)):
        time.sleep(0.01)
    sys.exit(3)
`), marks}
	cfg.Preload, cfg.MaxRestarts = "kfthread", 1
	cfg.Env = append(cfg.Env, "PYTHONPATH="+filepath.Dir(threaded))
	if ee, _ := runAgent(t, t.Context(), cfg); ee != nil {
		t.Fatalf("Run: %v\n%s", ee, out)
	}
	noted, _ := os.ReadDir(marks)
	var names []string
	for _, e := range noted {
		names = append(names, e.Name())
	}
	want := []string{"0-0-execd", "0-1-execd", "1-0-execd", "1-1-execd"}
	if s := out.String(); !slices.Equal(names, want) || !strings.Contains(s, "fork server refused") ||
		!strings.Contains(s, `msg="fork server given up`) {
		t.Errorf("workers %v, want %v after a refusal, and the server given up:\n%s", names, want, s)
	}
}

// A fork server that dies before it is ready (here: an interpreter that
// cannot run it) is not started again: every attempt is exec'd.
func TestForkServerDeadBeforeReadyGivenUp(t *testing.T) {
	testenv.NeedPython(t)
	// A "python" that runs the workers' scripts but dies on the server's -c.
	fake := filepath.Join(t.TempDir(), "python3")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n[ \"$1\" = -c ] && { echo 'no -c here' >&2; exit 2; }\nexec "+python+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, out := helperConfig(t, 1, "")
	cfg.Command = []string{fake, testenv.TempFile(t, "w.py", "import os, sys\nsys.exit(3 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 0)\n")}
	cfg.MaxRestarts = 1
	if ee, _ := runAgent(t, t.Context(), cfg); ee != nil {
		t.Fatalf("Run: %v\n%s", ee, out)
	}
	if s := out.String(); strings.Count(s, `msg="fork server starting"`) != 1 || !strings.Contains(s, "died before it was ready") ||
		!strings.Contains(s, "no -c here") {
		t.Errorf("want one fork server, given up with its log:\n%s", s)
	}
}
