package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// An agent whose stdout and stderr are pipes nobody reads: the workers'
// output keeps flowing to their logs, nobody looks hung to the watchdog, and
// the run succeeds. Before, the tee blocked on the full pipe, the workers
// then on theirs, and the watchdog killed them as Hang.
func TestUnreadOutputDoesNotStallWorkers(t *testing.T) {
	var readEnds []*os.File
	pipe := func() *os.File {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		readEnds = append(readEnds, r) // held open, never read
		t.Cleanup(func() { r.Close() })
		return w
	}
	stdout, stderr := pipe(), pipe()
	logDir := t.TempDir()
	// A stalled tee stalls the workers for good, so any hang timeout finds
	// it; 5 s, not 1, so that a busy machine's pause does not (one did:
	// exit 203 under -race on 2 cores).
	cmd := startAgentProcess(t, agentProcess{NProc: 2, Modes: "chatty:2s", HangTimeout: 5 * time.Second,
		StopGrace: time.Second, LogDir: logDir}, stdout, stderr)
	stdout.Close()
	stderr.Close()
	if code := waitExit(t, cmd, 40*time.Second); code != 0 {
		t.Fatalf("agent exit %d, want 0 (a worker killed as hung?)", code)
	}
	logs, _ := filepath.Glob(filepath.Join(logDir, "proc_*", "attempt_1", "*", "stdout.log"))
	if len(logs) != 2 {
		t.Fatalf("worker logs %v", logs)
	}
	for _, l := range logs {
		// 2 s at a line per millisecond, give or take the sleeps: far more
		// than the 64 KiB a pipe holds.
		if fi, err := os.Stat(l); err != nil || fi.Size() < 200*500 {
			t.Errorf("%s: %v bytes: the worker was held back", l, fi.Size())
		}
	}
}

// An agent whose stdout and stderr are closed pipes does not die of
// SIGPIPE: it supervises as usual and writes the pod's document.
func TestClosedOutputStillDocuments(t *testing.T) {
	pipe := func() *os.File {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
		return w
	}
	stdout, stderr := pipe(), pipe()
	docs := t.TempDir()
	cmd := startAgentProcess(t, agentProcess{NProc: 2, Modes: "chatty:300ms,exitlater:3", StopGrace: time.Second,
		ErrorPrefix: "file://" + docs}, stdout, stderr)
	stdout.Close()
	stderr.Close()
	if code := waitExit(t, cmd, 20*time.Second); code != 1 {
		t.Fatalf("agent exit %d, want 1 (the worker's exit 3; -1 is a death by SIGPIPE)", code)
	}
	files, _ := filepath.Glob(filepath.Join(docs, "error-*.pb"))
	if len(files) != 1 {
		t.Fatalf("documents %v, want one", files)
	}
	if f := readDocument(t, docs, filepath.Base(files[0])); f.Code != kferrors.CodeNonZeroExit || f.Worker != "pod-0/1" {
		t.Errorf("document %+v", f)
	}
}

// Each stop signal to the agent process, as README's table says: SIGTERM
// is a preemption (dump signal first, Preempted, 143); SIGINT, SIGHUP and
// SIGQUIT stop without the dump and document Signal<NAME>, exit 128+N. A
// second signal during the stop does not kill the agent.
func TestStopSignals(t *testing.T) {
	for _, tc := range []struct {
		sig    syscall.Signal
		code   string
		exit   int
		dumped bool
	}{
		{syscall.SIGTERM, kferrors.CodePreempted, 143, true},
		{syscall.SIGINT, "SignalSIGINT", 130, false},
		{syscall.SIGHUP, "SignalSIGHUP", 129, false},
		{syscall.SIGQUIT, "SignalSIGQUIT", 131, false},
	} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			t.Parallel() // each waits on its own agent process
			docs, dumpDir := t.TempDir(), t.TempDir()
			out := &syncBuffer{}
			// Rank 0 takes the dump signal; rank 1 ignores SIGTERM, so the
			// stop lasts the grace and a second signal lands in it.
			cmd := startAgentProcess(t, agentProcess{NProc: 2, Modes: "dump:" + dumpDir + ",ignoreterm", StopGrace: 700 * time.Millisecond,
				DumpSignal: syscall.SIGUSR1, DumpTimeout: time.Second, ErrorPrefix: "file://" + docs}, out, out)
			waitFor(t, out, "[default0]:helper dump", 10*time.Second)
			waitFor(t, out, "[default1]:helper ignoreterm", 10*time.Second)
			start := time.Now()
			_ = cmd.Process.Signal(tc.sig)
			waitFor(t, out, "signaling workers", 10*time.Second)
			_ = cmd.Process.Signal(tc.sig) // ignored: the stop is under way
			if code := waitExit(t, cmd, 20*time.Second); code != tc.exit {
				t.Fatalf("exit %d, want %d\n%s", code, tc.exit, out)
			}
			files, _ := filepath.Glob(filepath.Join(docs, "error-*.pb"))
			if len(files) != 1 {
				t.Fatalf("documents %v\n%s", files, out)
			}
			f := readDocument(t, docs, filepath.Base(files[0]))
			if f.Code != tc.code || f.Worker != "pod-0" || !f.Recoverable || f.Time.Before(start.Add(-time.Second)) {
				t.Errorf("document %+v", f)
			}
			_, err := os.Stat(filepath.Join(dumpDir, "dumped-0"))
			if dumped := err == nil; dumped != tc.dumped {
				t.Errorf("dump signal sent: %v, want %v", dumped, tc.dumped)
			}
			if tc.sig != syscall.SIGTERM && strings.Contains(out.String(), "SIGUSR1") {
				t.Errorf("dump signal mentioned for %v:\n%s", tc.sig, out)
			}
		})
	}
}

// pidsIn reads the pids the helpers wrote into files matching pattern,
// waiting until there are n; they are SIGKILLed when the test ends, should
// it fail.
func pidsIn(t *testing.T, pattern string, n int) []int {
	t.Helper()
	// Long enough for a torch import under load (the fork server's).
	deadline := time.Now().Add(60 * time.Second)
	for {
		files, _ := filepath.Glob(pattern)
		var pids []int
		for _, f := range files {
			data, _ := os.ReadFile(f)
			if pid, err := strconv.Atoi(string(data)); err == nil {
				pids = append(pids, pid)
			}
		}
		if len(pids) >= n {
			t.Cleanup(func() {
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pids in %s, want %d", len(pids), pattern, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitDead fails the test unless every pid is gone (or a zombie) within limit.
func waitDead(t *testing.T, pids []int, limit time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for _, pid := range pids {
		for testenv.Alive(pid) {
			if time.Now().After(deadline) {
				t.Errorf("%s: process %d still alive after %v", what, pid, limit)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// A SIGKILLed agent cannot clean up: its guardian does. The workers, a
// child in each worker's process group (what `sh -c 'python …; echo'`
// leaves) and a daemon in a session of its own all die with the agent.
func TestNoProcessOutlivesKilledAgent(t *testing.T) {
	dir := t.TempDir()
	logDir := t.TempDir()
	cmd := startAgentProcess(t, agentProcess{NProc: 2, Modes: "family:" + dir, StopGrace: time.Second, LogDir: logDir}, nil, nil)
	pids := pidsIn(t, filepath.Join(dir, "*-*"), 6)
	_ = cmd.Process.Kill()
	if code := waitExit(t, cmd, 10*time.Second); code != -1 {
		t.Fatalf("agent exit %d, want death by SIGKILL", code)
	}
	waitDead(t, pids, 3*time.Second, "after SIGKILL of the agent")
	// The guardian notes what it did once its sweep is over.
	waitFor(t, fileText(filepath.Join(logDir, "*", "guardian.log")), "killed", 3*time.Second)
}

// A daemon a worker started (in a session of its own, out of its process
// group) does not live into the next attempt, nor past the agent's exit.
func TestDaemonDoesNotSurviveRestartOrExit(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "daemon")
	cfg, out := helperConfig(t, 1, "daemon:"+pidFile+";checkdead:"+pidFile)
	cfg.MaxRestarts = 1
	if ee, _ := runAgent(t, t.Context(), cfg); ee != nil {
		t.Fatalf("Run: %v (the first attempt's daemon survived the restart?)\n%s", ee, out)
	}
	waitDead(t, pidsIn(t, pidFile+".next", 1), 2*time.Second, "after the agent returned")
}

// fileText is the content of the first file matching a pattern, as a
// Stringer for waitFor.
type fileText string

func (p fileText) String() string {
	files, _ := filepath.Glob(string(p))
	if len(files) == 0 {
		return ""
	}
	data, _ := os.ReadFile(files[0])
	return string(data)
}
