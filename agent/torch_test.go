package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/agent/guardian"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master"
)

// Real torch.distributed workers (gloo on CPU): Debian's torch 1.13 and,
// when scripts/deps.sh torch2 has built it, torch 2.14 on Python 3.14
// (testenv.Torches).

// python is the system's Python with torch 1.13, for what needs only a
// Python, or one torch.
const python = "/usr/bin/python3"

func needTorch(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("real torch workers: skipped with -short")
	}
	if err := testenv.TorchImports(python); err != nil {
		t.Fatalf("%s cannot import torch (%v): run scripts/deps.sh apt", python, err)
	}
}

// forEachTorch runs f as a subtest per torch here (torch1.13, torch2.14),
// py its interpreter; skipped with -short.
func forEachTorch(t *testing.T, f func(t *testing.T, py string)) {
	t.Helper()
	if testing.Short() {
		t.Skip("real torch workers: skipped with -short")
	}
	testenv.ForEachTorch(t, func(t *testing.T, tc testenv.Torch) { f(t, tc.Python) })
}

// onTorch runs f on one torch, prefer when it is here (testenv.OnTorch),
// py its interpreter; skipped with -short.
func onTorch(t *testing.T, prefer string, f func(t *testing.T, py string)) {
	t.Helper()
	if testing.Short() {
		t.Skip("real torch workers: skipped with -short")
	}
	testenv.OnTorch(t, prefer, func(t *testing.T, tc testenv.Torch) { f(t, tc.Python) })
}

func trainScript(t *testing.T) string {
	p, err := filepath.Abs("testdata/train/train_steps.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func torchConfig(t *testing.T, py string, nproc int, args ...string) (Config, *syncBuffer) {
	out := &syncBuffer{}
	return Config{
		Command: append([]string{py, trainScript(t)}, args...), NProcPerNode: nproc, MinNodes: 1, MaxNodes: 1,
		NodeRank: -1, RdzvID: "torchtest", LogDir: t.TempDir(), Pod: "pod-0", StopGrace: 5 * time.Second, Tee: true,
		Stdout: out, Stderr: out, MasterAddr: "127.0.0.1", Logger: slog.New(slog.NewTextHandler(out, nil)),
	}, out
}

var stepLine = regexp.MustCompile(`\[default(\d)\]:step (\d+) `)

// Seed experiment 5: kill -9 of one worker mid-training; the agent restarts
// the group in place (restart 1) and steps continue from the checkpoint;
// with the fork server (the default) and without (--fork-server=false).
func TestTorchKillRestarts(t *testing.T) {
	forEachTorch(t, func(t *testing.T, py string) { torchKillRestarts(t, py, false) })
}

// TestTorchKillRestartsWithoutForkServer is the same on the plain exec
// path (--no-fork-server, torchrun's), on one torch: the path is the
// agent's own, the same for every torch, and a torch 2.14 worker started
// without the fork server costs the most of any (issue 26).
func TestTorchKillRestartsWithoutForkServer(t *testing.T) {
	onTorch(t, "1.13", func(t *testing.T, py string) { torchKillRestarts(t, py, true) })
}

func torchKillRestarts(t *testing.T, py string, noFork bool) {
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	cfg, out := torchConfig(t, py, 2, "--steps", "60", "--sleep", "0.02", "--ckpt", ckpt)
	cfg.MaxRestarts, cfg.NoForkServer = 2, noFork
	done := make(chan error, 1)
	go func() { done <- Run(t.Context(), cfg) }()
	// A bound, not a timing: torch 2.x's import without the fork server
	// took 18 s on 2 busy cores.
	waitFor(t, out, "[default1]:step 20 ", time.Minute)
	m := regexp.MustCompile(`\[default1\]:restart 0 pid (\d+) `).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no pid of worker 1:\n%s", out)
	}
	pid, _ := strconv.Atoi(m[1])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v\n%s", err, out)
	}
	s := out.String()
	if forked := strings.Contains(s, `msg="fork server ready"`); forked == noFork {
		t.Errorf("fork server ready: %t, want %t:\n%s", forked, !noFork, s)
	}
	before, after, ok := strings.Cut(s, "restart_count=1")
	if !ok || !strings.Contains(after, "[default1]:restart 1 pid") {
		t.Fatalf("no restart with TORCHELASTIC_RESTART_COUNT=1:\n%s", s)
	}
	var last, first int = -1, -1
	for _, m := range stepLine.FindAllStringSubmatch(before, -1) {
		last, _ = strconv.Atoi(m[2])
	}
	steps := stepLine.FindAllStringSubmatch(after, -1)
	if len(steps) == 0 {
		t.Fatalf("no steps after the restart:\n%s", s)
	}
	first, _ = strconv.Atoi(steps[0][2])
	lastAfter, _ := strconv.Atoi(steps[len(steps)-1][2])
	if first == 0 || first > last || lastAfter != 59 {
		t.Errorf("steps before kill up to %d, after restart from %d to %d; want a resume from the checkpoint to 59", last, first, lastAfter)
	}
}

// A worker raising inside @record: the pod's document carries its
// exception, its sub-second time and its name — not the peer's secondary
// error a moment later.
func TestTorchRecordError(t *testing.T) {
	forEachTorch(t, torchRecordError)
}

func torchRecordError(t *testing.T, py string) {
	cfg, out := torchConfig(t, py, 2, "--steps", "100", "--sleep", "0.02", "--raise-at", "5", "--raise-rank", "1")
	dir := t.TempDir()
	cfg.ErrorPrefix = "file://" + dir
	start := time.Now()
	err := Run(t.Context(), cfg)
	ee, ok := err.(*ExitError)
	if !ok || ee.Code != 1 {
		t.Fatalf("want *ExitError with code 1, got %v\n%s", err, out)
	}
	f := readDocument(t, dir, ee.Document)
	if f.Code != "RuntimeError" || f.Worker != "pod-0/1" || f.Recoverable || !strings.Contains(f.Message, "boom at step 5 on rank 1") {
		t.Errorf("document = code %q worker %q recoverable %t message %q", f.Code, f.Worker, f.Recoverable, f.Message)
	}
	if f.Time.Before(start.Truncate(time.Second)) || f.Time.After(time.Now()) || f.Time.Nanosecond() == 0 {
		t.Errorf("document time %v: not a sub-second time within the run", f.Time)
	}
	t.Logf("agent log:\n%s", regexp.MustCompile(`(?m)^time=.*msg="(worker exited|pod error document)".*$`).FindAllString(out.String(), -1))
}

// The environment a worker sees under the agent is torchrun's of the same
// torch (c10d backend), for one script run under both, on torch 1.13 and
// 2.14 (whose torchrun sets TORCH_NCCL_ASYNC_ERROR_HANDLING and
// TORCHELASTIC_SIGNALS_TO_HANDLE instead of NCCL_ASYNC_ERROR_HANDLING).
// Values that legitimately differ are compared by presence only:
// MASTER_PORT (a free port each run), TORCHELASTIC_ERROR_FILE (each
// launcher's log folder), and on 2.x TORCHELASTIC_USE_AGENT_STORE (True
// under torchrun, whose agent hosts the workers' store). One difference is by
// design and checked: torchrun gives every rank the same MASTER_PORT, while
// under the agent's store proxy (the default) rank 0's is its store's private
// port and the others' is the proxy's. Variables only the
// agent adds: _F_WN, _F_DES (Flyte's per-worker documents),
// KFELASTIC_PROGRESS_FILE (hang watchdog), PYTHONUNBUFFERED (torchrun runs
// "python -u" instead).
func TestTorchEnvMatchesTorchrun(t *testing.T) {
	forEachTorch(t, torchEnvMatchesTorchrun)
}

func torchEnvMatchesTorchrun(t *testing.T, py string) {
	ours, theirs := t.TempDir(), t.TempDir()
	cfg, out := torchConfig(t, py, 2, "--steps", "1", "--sleep", "0", "--env-out", ours)
	cfg.RdzvID, cfg.MasterAddr, cfg.Env = "envcmp", "", cleanEnv()
	if err := Run(t.Context(), cfg); err != nil {
		t.Fatalf("agent: %v\n%s", err, out)
	}
	for rank := range 2 { // by default, from the fork server
		if data, _ := os.ReadFile(filepath.Join(ours, fmt.Sprintf("preloaded-0-%d", rank))); string(data) != "True" {
			t.Errorf("rank %d was not forked from the fork server (torch preloaded: %q)", rank, data)
		}
	}
	port := testenv.FreePort(t)
	cmd := exec.CommandContext(t.Context(), py, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
		"--max_restarts=0", "--monitor_interval=1", "--redirects", "2", "--tee", "2", "--rdzv_backend=c10d",
		"--rdzv_endpoint=127.0.0.1:"+strconv.Itoa(port), "--rdzv_id=envcmp", trainScript(t), "--steps", "1", "--sleep", "0", "--env-out", theirs)
	cmd.Env = cleanEnv()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("torchrun: %v\n%s", err, b)
	}
	if a0, a1 := readEnv(t, ours, 0, 0)["MASTER_PORT"], readEnv(t, ours, 0, 1)["MASTER_PORT"]; a0 == a1 {
		t.Errorf("ours: rank 0 and rank 1 both have MASTER_PORT %s; want rank 0's private store port", a0)
	}
	if b0, b1 := readEnv(t, theirs, 0, 0)["MASTER_PORT"], readEnv(t, theirs, 0, 1)["MASTER_PORT"]; b0 != b1 {
		t.Errorf("torchrun: MASTER_PORT %s for rank 0, %s for rank 1; want the same", b0, b1)
	}
	differ := []string{"MASTER_PORT", "TORCHELASTIC_ERROR_FILE"}
	if py != python {
		// torch 2.x's torchrun hosts the workers' store in its own agent
		// (True); the agent leaves it to the rank-0 worker, as torch 1.13
		// (False; WorkerEnv says why both work).
		differ = append(differ, "TORCHELASTIC_USE_AGENT_STORE")
	}
	oursOnly := []string{"_F_WN", "_F_DES", ProgressFileEnv, "PYTHONUNBUFFERED", guardian.MarkEnv}
	for rank := range 2 {
		a, b := readEnv(t, ours, 0, rank), readEnv(t, theirs, 0, rank)
		for _, k := range sortedKeys(a, b) {
			va, inA := a[k]
			vb, inB := b[k]
			switch {
			case slices.Contains(oursOnly, k):
				if !inA || inB {
					t.Errorf("rank %d: %s: ours %q (%t), torchrun's %q (%t); want ours only", rank, k, va, inA, vb, inB)
				}
			case slices.Contains(differ, k):
				if !inA || !inB {
					t.Errorf("rank %d: %s: ours %q, torchrun's %q; want both set", rank, k, va, vb)
				}
			case va != vb || inA != inB:
				t.Errorf("rank %d: %s: ours %q (%t), torchrun's %q (%t)", rank, k, va, inA, vb, inB)
			}
		}
	}
}

// cleanEnv is the test's environment without the variables both launchers
// set only when unset, so that their defaults are compared.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "NCCL_ASYNC_ERROR_HANDLING":
			continue
		}
		env = append(env, kv)
	}
	return env
}

func readEnv(t *testing.T, dir string, restart, rank int) map[string]string {
	return readJSON(t, filepath.Join(dir, fmt.Sprintf("env-%d-%d.json", restart, rank)))
}

func readJSON(t *testing.T, path string) map[string]string {
	return decodeFile[map[string]string](t, path)
}

// decodeFile is the JSON in a file, decoded as a T.
func decodeFile[T any](t *testing.T, path string) T {
	t.Helper()
	var v T
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func sortedKeys(ms ...map[string]string) []string {
	var ks []string
	for _, m := range ms {
		for k := range m {
			if !slices.Contains(ks, k) {
				ks = append(ks, k)
			}
		}
	}
	slices.Sort(ks)
	return ks
}

// Two agents × two workers, one job, through a real master on loopback;
// real gloo across both "nodes".
func TestTorchTwoAgents(t *testing.T) {
	forEachTorch(t, torchTwoAgents)
}

func torchTwoAgents(t *testing.T, py string) {
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "torchtest", MinNodes: 2, MaxNodes: 2})
	// A bound, not a timing: torch 2.14's cold start (Python 3.14, torch
	// and torch._dynamo imported) takes ≈10 s on a loaded 2-CPU machine.
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	type result struct {
		err error
		out *syncBuffer
	}
	results := make(chan result, 2)
	for i, pod := range []string{"job-worker-0", "job-worker-1"} {
		cfg, out := torchConfig(t, py, 2, "--steps", "20", "--sleep", "0.01")
		cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = pod, i, 2, 2
		cfg.RdzvBackend, cfg.RdzvEndpoint, cfg.TokenFile = "c10d", endpoint, tokenFile
		go func() { results <- result{Run(ctx, cfg), out} }()
	}
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatalf("Run: %v\n%s", r.err, r.out)
		}
		s := r.out.String()
		if !strings.Contains(s, "world 4") || !strings.Contains(s, "group_world_size=2") || !strings.Contains(s, "step 19 ") {
			t.Errorf("not a 4-worker run to step 19:\n%s", s)
		}
	}
}

// With --warm-spares a restart runs the script in an interpreter started
// ahead: it must see the same environment a cold worker would (only the
// per-attempt values differ), the same argv, sys.path[0], __file__ and
// __name__, and it must resume training.
func TestTorchWarmSpareRestart(t *testing.T) {
	forEachTorch(t, torchWarmSpareRestart)
}

func torchWarmSpareRestart(t *testing.T, py string) {
	dir, ckpt := t.TempDir(), filepath.Join(t.TempDir(), "ckpt")
	cfg, out := torchConfig(t, py, 2, "--steps", "40", "--sleep", "0.02", "--ckpt", ckpt, "--env-out", dir)
	cfg.MaxRestarts, cfg.WarmSpares, cfg.Env = 1, true, cleanEnv()
	done := make(chan error, 1)
	go func() { done <- Run(t.Context(), cfg) }()
	waitFor(t, out, "[default1]:step 15 ", 60*time.Second)
	m := regexp.MustCompile(`\[default1\]:restart 0 pid (\d+) `).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no pid of worker 1:\n%s", out)
	}
	pid, _ := strconv.Atoi(m[1])
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v\n%s", err, out)
	}
	t.Logf("%s", regexp.MustCompile(`(?m)^time=.*$`).FindAllString(out.String(), -1))
	if !strings.Contains(out.String(), "[default1]:step 39 ") {
		t.Errorf("training did not resume to step 39:\n%s", out)
	}
	perAttempt := []string{"MASTER_PORT", "TORCHELASTIC_ERROR_FILE", ProgressFileEnv, "TORCHELASTIC_RESTART_COUNT", guardian.MarkEnv}
	for rank := range 2 {
		cold, warm := readEnv(t, dir, 0, rank), readEnv(t, dir, 1, rank)
		if warm["TORCHELASTIC_RESTART_COUNT"] != "1" {
			t.Errorf("rank %d: restart count %q", rank, warm["TORCHELASTIC_RESTART_COUNT"])
		}
		for _, k := range sortedKeys(cold, warm) {
			if !slices.Contains(perAttempt, k) && cold[k] != warm[k] {
				t.Errorf("rank %d: %s: cold %q, warm spare %q", rank, k, cold[k], warm[k])
			}
		}
		a0, a1 := readArgv(t, dir, 0, rank), readArgv(t, dir, 1, rank)
		if fmt.Sprint(a0) != fmt.Sprint(a1) {
			t.Errorf("rank %d: cold %v, warm spare %v", rank, a0, a1)
		}
		// The restarted worker ran in a spare that had imported torch.
		for restart, want := range []string{"False", "True"} {
			data, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("preloaded-%d-%d", restart, rank)))
			if string(data) != want {
				t.Errorf("rank %d restart %d: torch preloaded = %q, want %s", rank, restart, data, want)
			}
		}
	}
}

func readArgv(t *testing.T, dir string, restart, rank int) map[string]any {
	return decodeFile[map[string]any](t, filepath.Join(dir, fmt.Sprintf("argv-%d-%d.json", restart, rank)))
}
