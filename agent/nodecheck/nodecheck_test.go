package nodecheck

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// The node check's tests run real check processes on loopback: the test
// binary itself is the Go check (`kfelastic node-check`) when
// goCheckChildEnv is set, /usr/bin/python3 with Debian's torch the torch
// check. A straggler is made for real: its check is pinned with taskset to
// a CPU that a busy loop also uses, at a lower priority.

// goCheckChildEnv makes the test binary run GoMain with its arguments.
const goCheckChildEnv = "KFELASTIC_TEST_GO_CHECK_CHILD"

func init() {
	if os.Getenv(goCheckChildEnv) == "1" {
		os.Exit(GoMain(os.Args[1:], os.Stdout, os.Stderr))
	}
}

// raceEnabled: this test binary, and so its Go check, runs with the race
// detector (nodecheck_race_test.go).
var raceEnabled bool

// goCheckChild is a Checker whose Go check is this test binary, run after
// prefix (e.g. taskset -c 0), with 3 matmuls rather than 30: fast even
// under the race detector. A later --work wins.
func goCheckChild(prefix ...string) *Checker {
	return &Checker{GoCheck: append(prefix, os.Args[0], "--work", "3"), Env: append(os.Environ(), goCheckChildEnv+"=1"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// checkGroup runs one check round of a group of len(members) on loopback
// and returns each member's result.
func checkGroup(t *testing.T, timeout time.Duration, members ...*Checker) []Result {
	t.Helper()
	port := testenv.FreePort(t)
	results := make([]Result, len(members))
	var wg sync.WaitGroup
	for r, c := range members {
		wg.Go(func() {
			results[r] = c.Run(t.Context(), Task{Check: 7, Round: 1, GroupRank: r, GroupSize: len(members),
				LeaderAddr: "127.0.0.1", LeaderPort: port, Timeout: timeout})
		})
	}
	wg.Wait()
	for r, res := range results {
		t.Logf("rank %d: ok=%v self=%v how=%s elapsed=%v message=%q", r, res.OK, res.Self, res.How, res.Elapsed, res.Message)
	}
	return results
}

// straggler makes a straggler for real: it returns a command prefix that
// runs a process at nice 10 on a CPU where two busy loops run at nice 0
// until the test ends. By CFS's weights (110 against 2 × 1024) the process
// gets a twentieth of that CPU; measured, its short check runs 5–10×
// slower than alone (a new task's first slice is generous). Other load on
// the machine slows it further, and slows an unpinned process on the other
// CPU far less, so the ratio holds on a busy machine too.
func straggler(t *testing.T) (slow []string, cpu int) {
	t.Helper()
	if raceEnabled {
		t.Skip("timings under the race detector tell nothing")
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Skipf("sched_getaffinity: %v", err)
	}
	cpu = -1
	for i := range 1024 {
		if set.IsSet(i) {
			cpu = i
			break
		}
	}
	taskset, err := exec.LookPath("taskset")
	if err != nil || set.Count() < 2 {
		t.Skipf("a real straggler needs taskset and 2 CPUs (taskset: %v, CPUs %d)", err, set.Count())
	}
	for range 2 {
		busy := exec.Command(taskset, "-c", strconv.Itoa(cpu), "sh", "-c", "while :; do :; done")
		if err := busy.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = busy.Process.Kill()
			_ = busy.Wait()
		})
	}
	return []string{taskset, "-c", strconv.Itoa(cpu), "nice", "-n", "10"}, cpu
}

// Healthy groups of one, two and three pass, through real processes and a
// real TCP all-reduce; the group of one only computes.
func TestNodeCheckGoGroups(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("size%d", n), func(t *testing.T) {
			members := make([]*Checker, n)
			for r := range members {
				members[r] = goCheckChild()
			}
			for r, res := range checkGroup(t, 10*time.Second, members...) {
				if !res.OK || res.How != "go" || res.Elapsed <= 0 || res.Elapsed > 5*time.Second || res.Message != "" {
					t.Errorf("rank %d: %+v, want a pass", r, res)
				}
			}
		})
	}
}

// A member killed by SIGKILL mid-check (the local engine's break-check)
// fails by itself; its partner fails too, as a failure of its group, and
// within the task's timeout. Either member may be the killed one: the
// leader's death leaves a member without the sum, a member's death leaves
// the leader waiting for it.
func TestNodeCheckGoKilledMember(t *testing.T) {
	for killed := range 2 {
		t.Run(fmt.Sprintf("rank%d", killed), func(t *testing.T) {
			members := []*Checker{goCheckChild(), goCheckChild()}
			// The killed member's check runs in a shell that kills its group
			// (and so the check) while the check computes (--work makes
			// that last ≈10 s).
			members[killed].GoCheck = []string{"sh", "-c", `"$@" --work 5000 & sleep 0.3; kill -KILL 0`, "sh", os.Args[0], "--work", "3"}
			// 5 s: a check process is this test binary built with -race,
			// and under make test's load starting one took most of 2 s,
			// so the partner ran out of its own time before it learned
			// of its group's failure.
			start := time.Now()
			res := checkGroup(t, 5*time.Second, members...)
			if took := time.Since(start); took > 6*time.Second {
				t.Errorf("the round took %v with a 5 s timeout", took)
			}
			if k := res[killed]; k.OK || !k.Self || !strings.Contains(k.Message, "killed by SIGKILL") {
				t.Errorf("killed member: %+v, want its own failure, killed by SIGKILL", k)
			}
			if p := res[1-killed]; p.OK || p.Self || p.Message == "" {
				t.Errorf("its partner: %+v, want a failure of the group, with a message", p)
			}
		})
	}
}

// A partner that never comes is named in the failure, which comes within
// the timeout and is not the waiting node's own.
func TestNodeCheckGoPartnerNeverComes(t *testing.T) {
	for _, c := range []struct {
		rank, size int
		want       string
	}{
		{0, 2, "group rank 1 did not come"},
		{0, 3, "group ranks 1, 2 did not come"},
		{1, 2, "cannot reach the group's leader"},
	} {
		t.Run(fmt.Sprintf("rank%dof%d", c.rank, c.size), func(t *testing.T) {
			t.Parallel()
			port := testenv.FreePort(t)
			start := time.Now()
			res := goCheckChild().Run(t.Context(), Task{GroupRank: c.rank, GroupSize: c.size,
				LeaderAddr: "127.0.0.1", LeaderPort: port, Timeout: 6 * time.Second})
			took := time.Since(start)
			t.Logf("alone: %+v after %v", res, took)
			// 6 s, not 2: under a cold make test the check's own start took
			// 1.5 s of 2, and the round timed out as a whole before the
			// missing member was named.
			if res.OK || res.Self || !strings.Contains(res.Message, c.want) {
				t.Errorf("alone: %+v, want a group failure saying %q", res, c.want)
			}
			if took > 7*time.Second {
				t.Errorf("alone, it took %v with a 6 s timeout", took)
			}
		})
	}
}

// A member slowed for real (its CPU shared with a busy loop) shows a clearly
// larger elapsed time than its partner, and the partner does not inherit
// it: each times its compute alone, and the exchange only from the moment
// the whole group has met.
func TestNodeCheckGoStraggler(t *testing.T) {
	slow, _ := straggler(t)
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("size%d", n), func(t *testing.T) {
			// The check's own 30 matmuls (≈50 ms alone), not the 3 of the
			// other tests: a slowdown shows over a longer run.
			members := make([]*Checker, n)
			for r := range members {
				members[r] = goCheckChild()
				members[r].GoCheck = append(members[r].GoCheck, "--work", "30")
			}
			members[n-1] = goCheckChild(slow...)
			members[n-1].GoCheck = append(members[n-1].GoCheck, "--work", "30")
			res := checkGroup(t, 20*time.Second, members...)
			for r, x := range res {
				if !x.OK {
					t.Fatalf("rank %d: %+v", r, x)
				}
			}
			for r := range n - 1 {
				if res[n-1].Elapsed < 2*res[r].Elapsed {
					t.Errorf("slowed rank %d took %v, rank %d %v: not told apart", n-1, res[n-1].Elapsed, r, res[r].Elapsed)
				}
			}
		})
	}
}

// A cancelled round ends at once, and with it the check's whole process
// group, the check's own children included.
func TestNodeCheckCancelKillsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	c := goCheckChild()
	c.GoCheck = []string{"sh", "-c", `sleep 30 & echo $! >` + pidFile + `; wait`, "sh"}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	res := c.Run(ctx, Task{GroupSize: 1, LeaderAddr: "127.0.0.1", LeaderPort: 1, Timeout: time.Minute})
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a cancelled round took %v", took)
	}
	if res.OK || !strings.Contains(res.Message, "cancel") {
		t.Errorf("cancelled round: %+v", res)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	deadline := time.Now().Add(2 * time.Second)
	for testenv.Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the check's child %d outlived the round", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fakePython is an executable shell script standing in for an interpreter.
func fakePython(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "python3")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// The torch check gets its group's torch env and none of the job's; its
// Elapsed is the work it measured, not how long the process lived.
func TestNodeCheckTorchEnvAndElapsed(t *testing.T) {
	envFile := filepath.Join(t.TempDir(), "env")
	py := fakePython(t, `env >`+envFile+`
case "$2" in *init_process_group*) ;; *) echo "no script" >&2; exit 1;; esac
sleep 0.3
echo '{"ok":true,"self":false,"elapsed":0.0125,"compute":0.0100,"allreduce":0.0025}'
`)
	job := []string{"PATH=" + os.Getenv("PATH"), "LOCAL_RANK=3", "RANK=9", "GROUP_RANK=4", "WORLD_SIZE=16", "LOCAL_WORLD_SIZE=4",
		"MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", "TORCHELASTIC_RUN_ID=job", "TORCHELASTIC_RESTART_COUNT=2",
		"TORCHELASTIC_USE_AGENT_STORE=True", "OMP_NUM_THREADS=8", "HOME=/home/job", "PYTHONPATH=/job/src"}
	c := &Checker{Python: py, Env: job}
	res := c.Run(t.Context(), Task{GroupRank: 1, GroupSize: 2, LeaderAddr: "10.1.2.3", LeaderPort: 4321, Timeout: 10 * time.Second})
	if !res.OK || res.How != "torch" || res.Elapsed != 12500*time.Microsecond {
		t.Errorf("result %+v, want a torch pass of 12.5ms (the measured work, not the process's 300 ms)", res)
	}
	b, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for k, want := range map[string]string{"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "4321", "RANK": "1", "WORLD_SIZE": "2",
		"OMP_NUM_THREADS": "1", "HOME": "/home/job", "PYTHONPATH": "/job/src", MarkEnv: "1"} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	for _, k := range []string{"LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
		"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE"} {
		if v, ok := env[k]; ok {
			t.Errorf("the job's %s=%s reached the check", k, v)
		}
	}
}

// A check that fails says why with the end of its stderr: the last lines,
// capped, valid UTF-8; it is not mistaken for "no torch".
func TestNodeCheckFailureMessage(t *testing.T) {
	py := fakePython(t, `i=0
while [ $i -lt 50 ]; do echo "line $i $(head -c 300 /dev/zero | tr '\0' x)" >&2; i=$((i+1)); done
printf 'RuntimeError: bad \377\376 bytes\n' >&2
exit 1
`)
	dir := t.TempDir()
	c := &Checker{Python: py, GoCheck: []string{"/bin/false"}, Dir: dir}
	res := c.Run(t.Context(), Task{Check: 3, Round: 2, GroupSize: 1, Timeout: 10 * time.Second})
	t.Logf("message: %q", res.Message)
	if res.OK || !res.Self || res.How != "torch" {
		t.Errorf("result %+v, want the torch check's own failure", res)
	}
	if !strings.Contains(res.Message, "RuntimeError: bad") || !strings.Contains(res.Message, "line 49") || strings.Contains(res.Message, "line 10 ") {
		t.Errorf("message %q: want the last lines of stderr only", res.Message)
	}
	if !utf8.ValidString(res.Message) || len(res.Message) > 2000 {
		t.Errorf("message of %d bytes, valid UTF-8 %v", len(res.Message), utf8.ValidString(res.Message))
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(logs) != 1 {
		t.Fatalf("logs %v, want the run's one log", logs)
	}
	if b, _ := os.ReadFile(logs[0]); !strings.Contains(string(b), "line 0 ") {
		t.Errorf("the log %s lacks the start of stderr", logs[0])
	}
}

// A check the agent must kill at the task's deadline is blamed for it only
// if it had not reached its group: one stuck waiting for its group (after
// its progress line) fails as a group failure, one stuck before it as its
// own; both within the timeout.
//
// The scripts are written before the subtests run in parallel: a script
// written while a parallel subtest forks is held open for writing by that
// child until it execs, and exec of the script fails with ETXTBSY ("text
// file busy", golang.org/issue/22315; seen under -race).
func TestNodeCheckDeadline(t *testing.T) {
	for _, c := range []struct {
		name, python string
		self         bool
		want         string
	}{
		{"in the group", fakePython(t, `echo '{"phase":"group","compute":0.01}'; exec sleep 30`+"\n"), false, "the group did not finish"},
		{"before it", fakePython(t, "exec sleep 30\n"), true, "did not finish within 1s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			nc := &Checker{Python: c.python}
			start := time.Now()
			res := nc.Run(t.Context(), Task{GroupSize: 2, GroupRank: 1, LeaderAddr: "127.0.0.1", LeaderPort: 1, Timeout: time.Second})
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("took %v with a 1 s timeout", took)
			}
			if res.OK || res.Self != c.self || !strings.Contains(res.Message, c.want) {
				t.Errorf("%+v, want self=%v and %q", res, c.self, c.want)
			}
		})
	}
}

// An interpreter without torch falls back to the Go check: a stand-in that
// exits 3 as nodecheck.py does, and the pyenv python3 first on PATH here
// (which cannot see Debian's torch), where there is one.
func TestNodeCheckNoTorchFallsBack(t *testing.T) {
	pythons := []string{fakePython(t, "echo 'kfelastic node check: torch cannot be imported: No module named torch' >&2\nexit 3\n"),
		filepath.Join(t.TempDir(), "no-such-python3")}
	if p, err := exec.LookPath("python3"); err == nil && exec.Command(p, "-c", "import torch").Run() != nil {
		pythons = append(pythons, p)
	} else {
		t.Logf("no python3 without torch on PATH (%v): testing the stand-in only", err)
	}
	for _, py := range pythons {
		c := goCheckChild()
		c.Python = py
		res := checkGroup(t, 20*time.Second, c, goCheckChild())
		if !res[0].OK || res[0].How != "go" {
			t.Errorf("%s: %+v, want the Go check's pass", py, res[0])
		}
	}
}

// torchPython is Debian's /usr/bin/python3 if it can import
// torch.distributed (testenv.TorchFor).
func torchPython(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("the torch check imports torch (≈1 s a process): skipped with -short")
	}
	tc, why := testenv.TorchFor("1.13")
	if why != "" {
		t.Skip(why)
	}
	return tc.Python
}

// The torch check passes with a real gloo pair and a group of one, and a
// straggler made for real shows in its elapsed time. The straggler imports
// torch at full speed (which would take tens of seconds at its slowed
// share of a CPU) and slows itself down after, from a sitecustomize: the
// check's own compute and all-reduce run slowed, as on a throttled node.
func TestNodeCheckTorch(t *testing.T) {
	py := torchPython(t)
	torch := func() *Checker {
		c := goCheckChild()
		c.Python = py
		return c
	}
	for _, n := range []int{1, 2} {
		members := make([]*Checker, n)
		for r := range members {
			members[r] = torch()
		}
		start := time.Now()
		res := checkGroup(t, 60*time.Second, members...)
		t.Logf("group of %d: round took %v, the import included", n, time.Since(start))
		for r, x := range res {
			if !x.OK || x.How != "torch" || x.Elapsed <= 0 || x.Elapsed > 5*time.Second {
				t.Errorf("group of %d, rank %d: %+v, want a torch pass", n, r, x)
			}
		}
	}
	_, cpu := straggler(t)
	site := t.TempDir()
	if err := os.WriteFile(filepath.Join(site, "sitecustomize.py"), []byte(fmt.Sprintf(
		"import os\nimport torch\nos.sched_setaffinity(0, {%d})\nos.nice(10)\n", cpu)), 0o644); err != nil {
		t.Fatal(err)
	}
	slow := torch()
	slow.Env = append(slow.Env, "PYTHONPATH="+site)
	start := time.Now()
	res := checkGroup(t, 60*time.Second, torch(), slow)
	t.Logf("with a straggler: round took %v", time.Since(start))
	if !res[0].OK || !res[1].OK {
		t.Fatalf("results %+v", res)
	}
	if res[1].Elapsed < 2*res[0].Elapsed {
		t.Errorf("slowed rank 1 took %v, rank 0 %v: not told apart", res[1].Elapsed, res[0].Elapsed)
	}
}

// A torch check killed mid-round (break-check) fails by itself; its gloo
// partner reports a failure of the group before the task's timeout.
func TestNodeCheckTorchKilledMember(t *testing.T) {
	py := torchPython(t)
	killer := fakePython(t, py+` "$@" & sleep 0.5; kill -KILL 0`+"\n")
	mk := func(p string) *Checker {
		c := goCheckChild()
		c.Python = p
		return c
	}
	// Room for the partner's import of torch on a loaded machine (it
	// took over 8 s beside a build on 2 cores): it must reach the group
	// to fail as one.
	start := time.Now()
	res := checkGroup(t, 20*time.Second, mk(py), mk(killer))
	if took := time.Since(start); took > 21*time.Second {
		t.Errorf("the round took %v with a 20 s timeout", took)
	}
	if k := res[1]; k.OK || !k.Self || !strings.Contains(k.Message, "killed by SIGKILL") || k.How != "torch" {
		t.Errorf("killed member: %+v", k)
	}
	if p := res[0]; p.OK || p.Self || p.How != "torch" {
		t.Errorf("its partner: %+v, want a torch failure of the group", p)
	}
}

// The JSON line both checks print, as the Go check prints it.
func TestNodeCheckGoLine(t *testing.T) {
	var out, errOut strings.Builder
	if code := GoMain([]string{"--size", "1", "--rank", "0"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var line map[string]any
	if err := json.Unmarshal([]byte(out.String()), &line); err != nil || strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	for _, k := range []string{"ok", "self", "elapsed", "compute", "allreduce"} {
		if _, ok := line[k]; !ok {
			t.Errorf("line %s lacks %q", out.String(), k)
		}
	}
	if code := GoMain([]string{"--size", "2", "--rank", "2"}, &out, &errOut); code != 2 {
		t.Errorf("rank 2 of 2: exit %d, want 2", code)
	}
}
