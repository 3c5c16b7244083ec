package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
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

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/flytekitdoc"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/outputreader"
)

// standIn is the flytekit stand-in (testdata/flytekit/elastic_task.py):
// torch's elastic_launch called as flytekit's Elastic task calls it.
func standIn(t *testing.T) string {
	p, err := filepath.Abs("../testdata/flytekit/elastic_task.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCommandEnv(t *testing.T) {
	cfg := &Config{MinNodes: 2, MaxNodes: 3, NProcPerNode: 4, MaxRestarts: 2, RdzvID: "job", NodeRank: 1,
		RdzvEndpoint: "master:29400"}
	base := []string{"PET_NNODES=2:3", "PET_RDZV_ENDPOINT=master:29400", "_F_WN=pod-1", "_F_DES=Earliest",
		"PET_MAX_RESTARTS=", "PYTHONUNBUFFERED=0", "PATH=/bin",
		// torchrun's static default, and a conf that would have torch host the store.
		"PET_RDZV_BACKEND=static", "PET_RDZV_CONF=is_host=1,last_call_timeout=1",
		// The training operator's, for worker index 1 beside a Master
		// replica (numbered from 1, the master counted in WORLD_SIZE).
		"PET_NODE_RANK=2", "RANK=2", "WORLD_SIZE=12", "MASTER_ADDR=job-master-0", "MASTER_PORT=23456",
		"PET_MASTER_ADDR=job-master-0", "PET_MASTER_PORT=23456"}
	got := CommandEnv(base, commandSpec{cfg: cfg, rdzvEndpoint: "127.0.0.1:4242", errorFile: "/e", progressFile: "/p", mark: "a/1"})
	want := []string{"KFELASTIC_AGENT=a/1", "KFELASTIC_PROGRESS_FILE=/p", "PATH=/bin", "PET_MAX_RESTARTS=2",
		"PET_NNODES=2:3", "PET_NODE_RANK=1", "PET_NPROC_PER_NODE=4", "PET_RDZV_BACKEND=c10d",
		"PET_RDZV_CONF=last_call_timeout=1,is_host=false", "PET_RDZV_ENDPOINT=0.0.0.0:4242", "PET_RDZV_ID=job", "PYTHONUNBUFFERED=0", "TORCHELASTIC_ERROR_FILE=/e", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "_F_DES=Earliest", "_F_WN=pod-1"}
	if !slices.Equal(got, want) {
		t.Errorf("CommandEnv:\n got %q\nwant %q", got, want)
	}
	// Where this machine's name does not resolve, torch could not compare
	// 0.0.0.0 with it: the relay's loopback address stays.
	got = CommandEnv(base, commandSpec{cfg: cfg, rdzvEndpoint: "127.0.0.1:4242", loopback: true})
	if !slices.Contains(got, "PET_RDZV_ENDPOINT=127.0.0.1:4242") {
		t.Errorf("CommandEnv, hostname unresolved: %q", got)
	}
	// The torch hook (agent/torchhook) first on PYTHONPATH: the forkserver
	// with the fork server's preload, c10d's poll only with the relay.
	hooked := append(slices.Clone(base), "PYTHONPATH=/image")
	got = CommandEnv(hooked, commandSpec{cfg: cfg, rdzvEndpoint: "127.0.0.1:4242", hook: "/hook", roundFile: "/run/master-round"})
	for _, kv := range []string{"PYTHONPATH=/hook:/image", "KFELASTIC_SPAWN_PRELOAD=torch", "KFELASTIC_RDZV_POLL=0.1", "KFELASTIC_DRAIN_ERRORS=1",
		"KFELASTIC_RDZV_ROUND_FILE=/run/master-round"} {
		if !slices.Contains(got, kv) {
			t.Errorf("CommandEnv with the hook: no %s in %q", kv, got)
		}
	}
	off := *cfg
	off.NoForkServer = true
	// With neither, the hook still reads the workers' error queues (a
	// traceback past the pipe hung torch 1.13's spawned workers): no
	// forkserver, no poll.
	got = CommandEnv(nil, commandSpec{cfg: &off, hook: "/hook", roundFile: "/run/master-round"})
	if slices.ContainsFunc(got, func(s string) bool {
		return strings.HasPrefix(s, "KFELASTIC_SPAWN_PRELOAD=") || strings.HasPrefix(s, "KFELASTIC_RDZV_POLL=") ||
			strings.HasPrefix(s, "KFELASTIC_RDZV_ROUND_FILE=")
	}) || !slices.Contains(got, "KFELASTIC_DRAIN_ERRORS=1") || !slices.Contains(got, "PYTHONPATH=/hook") {
		t.Errorf("CommandEnv with --fork-server=false and no relay: want the hook for the error queues alone: %q", got)
	}
	// Without a relay (no master) the endpoint is the pod's, or the flag's.
	got = CommandEnv(nil, commandSpec{cfg: cfg})
	if !slices.Contains(got, "PET_RDZV_ENDPOINT=master:29400") || slices.ContainsFunc(got, func(s string) bool {
		return strings.HasPrefix(s, "RANK=") || strings.HasPrefix(s, "_F_WN=") || strings.HasPrefix(s, "PET_RDZV_BACKEND=")
	}) {
		t.Errorf("CommandEnv without relay: %q", got)
	}
}

// The command's failure ends the pod: no restart whatever the budget (torch
// restarts its workers inside the command), its exit status decides.
func TestCommandFailureIsNotRestarted(t *testing.T) {
	cfg, out := helperConfig(t, 4, "ok")
	cfg.Launcher, cfg.MaxRestarts = LauncherCommand, 3
	cfg.Command = []string{"/bin/sh", "-c", `echo "child $KFELASTIC_AGENT"; exit 3`}
	ee, _ := runBounded(t, t.Context(), cfg, 10*time.Second)
	if ee == nil || ee.Code != 1 || ee.Failure.Worker != "pod-0/0" {
		t.Fatalf("want a user failure of pod-0/0, exit 1; got %+v\n%s", ee, out)
	}
	if n := strings.Count(out.String(), "child "); n != 1 {
		t.Errorf("%d children started, want 1:\n%s", n, out)
	}
}

// One child under --launcher command, without a master (one node): torch's
// elastic_launch in the flytekit stand-in forks nproc workers itself, hosts
// its own c10d store (PET_RDZV_ENDPOINT is left alone), and training ends.
func TestCommandRealTorchSingleNode(t *testing.T) {
	forEachTorch(t, commandRealTorchSingleNode)
}

func commandRealTorchSingleNode(t *testing.T, py string) {
	cfg, out := torchConfig(t, py, 2)
	cfg.Launcher = LauncherCommand
	cfg.Command = []string{py, standIn(t), "--output-prefix", t.TempDir(), "--nproc-per-node", "2", "--steps", "15", "--sleep", "0.01"}
	cfg.Env = append(os.Environ(), fmt.Sprintf("PET_RDZV_ENDPOINT=127.0.0.1:%d", testenv.FreePort(t)), "OMP_NUM_THREADS=1")
	if ee, _ := runBounded(t, t.Context(), cfg, 60*time.Second); ee != nil {
		t.Fatalf("Run: %v\n%s", ee, out)
	}
	s := out.String()
	if strings.Count(s, "[default0]:step = 14") != 2 || !strings.Contains(s, "[default0]:result {'rank': 0") {
		t.Errorf("two workers should reach step 14 and rank 0 return its result:\n%s", s)
	}
	if strings.Contains(s, "[default1]") || strings.Contains(s, "Rendezvous complete for workers. Result:\n  restart_count=0\n  master_addr=127.0.0.1") {
		t.Errorf("the agent started workers itself:\n%s", s)
	}
}

// SIGTERM under --launcher command: the dump signal reaches torch's
// workers (they checkpoint), not torch's agent (whose default action would
// end it first); then the stop and a Preempted document, exit 143.
func TestCommandRealTorchDumpAndPreempted(t *testing.T) {
	forEachTorch(t, commandRealTorchDumpAndPreempted)
}

func commandRealTorchDumpAndPreempted(t *testing.T, py string) {
	cfg, out := torchConfig(t, py, 2)
	cfg.Launcher = LauncherCommand
	cfg.DumpSignal, cfg.DumpTimeout = syscall.SIGUSR1, 3*time.Second
	docs := t.TempDir()
	cfg.ErrorPrefix = "file://" + docs
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	cfg.Command = []string{py, standIn(t), "--output-prefix", docs, "--nproc-per-node", "2", "--steps", "100000", "--sleep", "0.02", "--ckpt", ckpt}
	cfg.Env = append(os.Environ(), fmt.Sprintf("PET_RDZV_ENDPOINT=127.0.0.1:%d", testenv.FreePort(t)), "OMP_NUM_THREADS=1")
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		waitFor(t, out, "[default0]:step = 12", 40*time.Second)
		cancel()
	}()
	ee, _ := runBounded(t, ctx, cfg, 60*time.Second)
	if ee == nil || ee.Code != 143 || ee.Failure.Code != kferrors.CodePreempted {
		t.Fatalf("want Preempted 143, got %+v\n%s", ee, out)
	}
	s := out.String()
	if n := strings.Count(s, "[default0]:dumped at step"); n != 2 {
		t.Errorf("%d workers dumped, want 2:\n%s", n, s)
	}
	if b, err := os.ReadFile(ckpt); err != nil || len(b) == 0 {
		t.Errorf("no checkpoint from the dump: %v", err)
	}
	if f := readDocument(t, docs, ee.Document); f.Code != kferrors.CodePreempted {
		t.Errorf("document %+v", f)
	}
}

// The hang watchdog watches the command's output as a worker's.
func TestCommandHangWatchdog(t *testing.T) {
	cfg, out := helperConfig(t, 2, "hang")
	cfg.Launcher, cfg.HangTimeout = LauncherCommand, 500*time.Millisecond
	ee, _ := runBounded(t, t.Context(), cfg, 10*time.Second)
	if ee == nil || ee.Failure.Code != kferrors.CodeHang || ee.Code != kferrors.ExitHang {
		t.Fatalf("want Hang, got %+v\n%s", ee, out)
	}
}

// commandAgent runs a command-mode agent on the master until ctx ends.
func commandAgent(t *testing.T, ctx context.Context, endpoint, tokenFile, pod string, rank, minNodes int, mode string) (chan error, *syncBuffer) {
	cfg, out := helperConfig(t, 2, mode)
	cfg.Launcher, cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = LauncherCommand, pod, rank, minNodes, 2
	cfg.RdzvBackend, cfg.RdzvEndpoint, cfg.TokenFile = "c10d", endpoint, tokenFile
	cfg.HeartbeatInterval = 200 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	return done, out
}

// A master round that changes while the command runs (a second pod joins)
// does not stop the command: the agent re-joins, the master completes a
// round with both, and the command runs on; its PET_RDZV_ENDPOINT is the
// agent's relay on loopback, not the master.
func TestCommandMasterRoundDoesNotStopChild(t *testing.T) {
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 1, MaxNodes: 2, WaitingTimeout: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	doneA, outA := commandAgent(t, ctx, endpoint, tokenFile, "pod-a", 0, 1, "hang")
	waitFor(t, outA, "[default0]:helper hang", 5*time.Second)
	doneB, outB := commandAgent(t, t.Context(), endpoint, tokenFile, "pod-b", 1, 1, "ok")
	if err := <-doneB; err != nil {
		t.Fatalf("pod-b: %v\n%s", err, outB)
	}
	waitFor(t, outA, "the command goes on", 5*time.Second)
	cancel()
	err := <-doneA
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Failure.Code != kferrors.CodePreempted {
		t.Fatalf("pod-a: want Preempted, got %v\n%s", err, outA)
	}
	s := outA.String()
	if n := strings.Count(s, "helper hang"); n != 1 {
		t.Errorf("pod-a's command started %d times, want once:\n%s", n, s)
	}
	if !regexp.MustCompile(`command started".*rdzv_endpoint=127\.0\.0\.1:\d+`).MatchString(s) {
		t.Errorf("no relay endpoint for the command:\n%s", s)
	}
}

// The master's EXIT stops the command: the other pod of a 2:2 job fails
// for good (its command exits 1: a user error, not relaunched), the master
// stops the job, and the agent learns it on its heartbeat, stops its
// command and exits 1 with the master's code. pod-b's command fails only
// once pod-a's has started (a fixed delay lost that race on a loaded
// machine).
func TestCommandMasterExitStopsChild(t *testing.T) {
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 2, MaxNodes: 2, WaitingTimeout: 100 * time.Millisecond})
	fail := filepath.Join(t.TempDir(), "fail")
	doneA, outA := commandAgent(t, t.Context(), endpoint, tokenFile, "pod-a", 0, 2, "hang")
	doneB, outB := commandAgent(t, t.Context(), endpoint, tokenFile, "pod-b", 1, 2, "exitwhen:"+fail)
	waitFor(t, outA, "[default0]:helper hang", 10*time.Second)
	if err := os.WriteFile(fail, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`helper hang rank \S* restart \d+ pid (\d+)`).FindStringSubmatch(outA.String())
	if m == nil {
		t.Fatalf("no child pid:\n%s", outA)
	}
	pid, _ := strconv.Atoi(m[1])
	var ee *ExitError
	if err := <-doneB; !errors.As(err, &ee) || ee.Code != 1 {
		t.Fatalf("pod-b: want a user failure, got %v\n%s", err, outB)
	}
	var errA error
	select {
	case errA = <-doneA:
	case <-time.After(10 * time.Second):
		t.Fatalf("the agent of a stopped job goes on:\n%s", outA)
	}
	if !errors.As(errA, &ee) || ee.Failure.Code != kferrors.CodeJobStopped || ee.Code != 1 {
		t.Fatalf("pod-a: want JobStopped, exit 1; got %v\n%s", errA, outA)
	}
	if testenv.Alive(pid) {
		t.Errorf("the command %d of the stopped job lives on", pid)
	}
}

// A command whose main is under torch's @record (torchrun's is) writes its
// exception to the TORCHELASTIC_ERROR_FILE the agent gives it, and the
// pod's document has that exception, not only an exit code. (torch 1.13's
// torchrun itself fails on this Python before any worker starts, so the
// command here is a script with @record.)
func TestCommandRealTorchErrorFile(t *testing.T) {
	forEachTorch(t, commandRealTorchErrorFile)
}

func commandRealTorchErrorFile(t *testing.T, py string) {
	cfg, out := torchConfig(t, py, 2)
	cfg.Launcher = LauncherCommand
	cfg.Command = []string{py, "-c", `from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("bad launch config")

main()
`}
	ee, _ := runBounded(t, t.Context(), cfg, 60*time.Second)
	if ee == nil || ee.Code != 1 || ee.Failure.Code != "ValueError" || !strings.Contains(ee.Failure.Message, "bad launch config") {
		t.Fatalf("want the command's ValueError, got %+v\n%s", ee, out)
	}
}

// pyflyteHelper is the helper mode pyflyte (helperEnv): what
// pyflyte-execute does for a failed Elastic task, with its workers' torch
// error files where torch elastic keeps them
// (<dir>/attempt_0/<local rank>/error.json). The argument is
// dir|second|ms|line|exit[|ms|line…]: local rank 0 fails at second+ms
// with line, each further ms|line pair is the next local rank's failure;
// flytekit's document names rank 0 (torch's pick within one whole
// second: the lowest rank) and lands in dir. exit is the command's exit
// status, "<status>/<delay>" to exit after a delay, or "hang" to wait
// for the agent's stop.
func pyflyteHelper(arg string) int {
	p := strings.Split(arg, "|")
	sec, _ := strconv.ParseInt(p[1], 10, 64)
	tmp, err := os.MkdirTemp("", "torchelastic_")
	if err != nil {
		return 97
	}
	ranks := append([]string{p[2], p[3]}, p[5:]...)
	var errorFile string
	var first time.Time
	for r := 0; r+1 < len(ranks); r += 2 {
		ms, _ := strconv.Atoi(ranks[r])
		line := ranks[r+1]
		at := time.Unix(sec, int64(ms)*int64(time.Millisecond))
		dir := filepath.Join(tmp, "attempt_0", strconv.Itoa(r/2))
		path := filepath.Join(dir, "error.json")
		data := fmt.Sprintf(`{"message":{"message":%q,"extraInfo":{"py_callstack":"Traceback (most recent call last):\n  File \"train.py\"\n%s","timestamp":"%d"}}}`,
			line, line, sec)
		if os.MkdirAll(dir, 0o755) != nil || os.WriteFile(path, []byte(data), 0o644) != nil || os.Chtimes(path, at, at) != nil {
			return 97
		}
		if r == 0 {
			errorFile = path
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	ms0, _ := strconv.Atoi(p[2])
	last := time.Unix(sec, int64(ms0)*int64(time.Millisecond))
	for r := 2; r+1 < len(ranks); r += 2 {
		ms, _ := strconv.Atoi(ranks[r])
		if at := time.Unix(sec, int64(ms)*int64(time.Millisecond)); at.After(last) {
			last = at
		}
	}
	time.Sleep(time.Until(last))
	doc, _ := kferrors.Encode(flytekitdoc.Failure(os.Getenv("_F_WN"), p[3], errorFile, first).Document(0))
	if os.WriteFile(filepath.Join(p[0], flytekitdoc.Key()), doc, 0o644) != nil {
		return 97
	}
	exit, delay, _ := strings.Cut(p[4], "/")
	if exit == "hang" {
		time.Sleep(time.Hour)
	}
	if d, err := time.ParseDuration(delay); err == nil {
		time.Sleep(d)
	}
	code, _ := strconv.Atoi(exit)
	return code
}

// Two pods under --launcher command whose workers failed within one second
// (issue 17): job-worker-1 raised ValueError at .300, job-worker-0's worker
// lost its peer at .700. Each command writes flytekit's document (torch's
// whole second, worker = the pod) and exits 0, as pyflyte-execute does.
// Each agent refines its pod's document with its worker's error file, so
// the reader puts the real root cause first (flytekit's originals are kept
// in refined/, which neither the reader nor the report counts as a
// failure); the pod exits 0 as flytekit
// had it; with FLYTE_FAIL_ON_ERROR's exit 1 the agent writes no second
// document.
func TestCommandRefinesFlytekitDocuments(t *testing.T) {
	dir := t.TempDir()
	// Both workers fail in a second after both groups started.
	sec := time.Now().Unix() + 3
	type result struct {
		ee  *ExitError
		out *syncBuffer
	}
	run := func(pod, ms, line, exit string) chan result {
		cfg, out := helperConfig(t, 1, "pyflyte:"+strings.Join([]string{dir, strconv.FormatInt(sec, 10), ms, line, exit}, "|"))
		cfg.Launcher, cfg.Pod, cfg.ErrorPrefix = LauncherCommand, pod, "file://"+dir
		cfg.Env = append(cfg.Env, "_F_WN="+pod, "_F_DES=Earliest")
		done := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var ee *ExitError
			if err := Run(ctx, cfg); err != nil && !errors.As(err, &ee) {
				t.Errorf("%s: Run: %v", pod, err)
			}
			done <- result{ee, out}
		}()
		return done
	}
	pod0 := run("job-worker-0", "700", "RuntimeError: [gloo] Connection closed by peer [10.0.0.7]:33155", "0")
	pod1 := run("job-worker-1", "300", "ValueError: batch 17 has NaN labels", "1")
	if r := <-pod0; r.ee != nil {
		t.Fatalf("job-worker-0: %v, want exit 0 as flytekit\n%s", r.ee, r.out)
	}
	r1 := <-pod1
	ee, out := r1.ee, r1.out
	if ee == nil || ee.Code != 1 || !strings.HasPrefix(ee.Document, "error-") || ee.Failure.Worker != "job-worker-1" ||
		ee.Failure.Time.Nanosecond() != 300_000_000 {
		t.Fatalf("job-worker-1 (FLYTE_FAIL_ON_ERROR): %+v, want exit 1 with the refined document\n%s", ee, out)
	}
	top, _ := filepath.Glob(filepath.Join(dir, "error-*.pb"))
	kept, _ := filepath.Glob(filepath.Join(dir, kferrors.RefinedPrefix, "error-*.pb"))
	if len(top) != 2 || len(kept) != 2 {
		t.Fatalf("documents %v, superseded %v: want one refined per pod, flytekit's two moved", top, kept)
	}
	r := readRootCause(t, dir)
	if got := r.RootCause; got.Failure.Worker != "job-worker-1" || got.Failure.Code != flytekitdoc.Code ||
		!got.Time().Equal(time.Unix(sec, 300_000_000)) {
		t.Errorf("root cause %s %s at %s, want job-worker-1's at .300", got.Failure.Worker, got.Failure.Code, got.Time())
	}
	if msg := r.Message(); !strings.Contains(msg, "] ValueError: batch 17 has NaN labels\n") {
		t.Errorf("UI message: %s", msg)
	}
}

// The command's workers are what torch's agent started: spawned ones (with
// multiprocessing's resource tracker beside them, which is no worker and
// must not get the dump signal: its default action would kill it), forked
// ones, and the children of multiprocessing's forkserver (the torch hook's),
// also below a launcher in between (pyflyte-fast-execute runs
// pyflyte-execute as its child).
func TestCommandWorkers(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	script := filepath.Join(t.TempDir(), "workers.py")
	_ = os.WriteFile(script, []byte(`import multiprocessing as mp, sys, time
def work():
    time.sleep(60)
if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    ps = [ctx.Process(target=work) for _ in range(2)]
    for p in ps:
        p.start()
    if sys.argv[1] == "spawn":
        ctx.Lock()  # a semaphore: the resource tracker runs
    print(" ".join(str(p.pid) for p in ps), flush=True)
    time.sleep(60)
`), 0o644)
	for _, c := range []struct{ method, launcher string }{{"spawn", ""}, {"fork", ""}, {"forkserver", ""}, {"spawn", "launcher"}} {
		t.Run(c.method+c.launcher, func(t *testing.T) {
			args := []string{script, c.method}
			if c.launcher != "" {
				args = []string{"-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))", py, script, c.method}
			}
			cmd := exec.Command(py, args...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }()
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			var want []int
			for f := range strings.FieldsSeq(line) {
				n, _ := strconv.Atoi(f)
				want = append(want, n)
			}
			got := commandWorkers(cmd.Process.Pid)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("workers %v, want %v", got, want)
			}
			if c.method == "spawn" {
				tracker := false
				for _, p := range childPIDs(cmd.Process.Pid) {
					for _, q := range append([]int{p}, childPIDs(p)...) {
						tracker = tracker || multiprocessingHelper(procCmdline(q))
					}
				}
				if !tracker {
					t.Error("no resource tracker beside spawned workers: the test shows nothing")
				}
			}
		})
	}
}

// readRootCause reads the documents under dir as the plugin does.
func readRootCause(t *testing.T, dir string) *outputreader.Report {
	t.Helper()
	b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r, err := outputreader.Read(t.Context(), outputreader.NewBucketSource(b), nil)
	if err != nil || r.RootCause == nil {
		t.Fatalf("Read: %v, %+v", err, r)
	}
	return r
}

// Issue 27, item 1: the pod the master stops refines flytekit's document
// too. job-worker-1 raised ValueError at .300 and its command exits 1 (the
// master stops the job); job-worker-0's worker lost its peer at .400 and
// its command waits until the agent stops it on the master's EXIT. Its
// document, adopted on the way out, must carry .400, not torch's .000,
// which would sort before .300.
func TestCommandRefinesDocumentOfStoppedPod(t *testing.T) {
	dir := t.TempDir()
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 2, MaxNodes: 2, WaitingTimeout: 100 * time.Millisecond})
	sec := time.Now().Unix() + 3
	run := func(pod string, rank int, ms, line, exit string) chan error {
		cfg, out := helperConfig(t, 1, "pyflyte:"+strings.Join([]string{dir, strconv.FormatInt(sec, 10), ms, line, exit}, "|"))
		cfg.Launcher, cfg.Pod, cfg.ErrorPrefix, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = LauncherCommand, pod, "file://"+dir, rank, 2, 2
		cfg.RdzvBackend, cfg.RdzvEndpoint, cfg.TokenFile = "c10d", endpoint, tokenFile
		cfg.HeartbeatInterval = 100 * time.Millisecond
		cfg.Env = append(cfg.Env, "_F_WN="+pod, "_F_DES=Earliest")
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err := Run(ctx, cfg)
			if err != nil {
				t.Logf("%s: %v\n%s", pod, err, out)
			}
			done <- err
		}()
		return done
	}
	pod0 := run("job-worker-0", 0, "400", "RuntimeError: [gloo] Connection closed by peer [10.0.0.7]:33155", "hang")
	pod1 := run("job-worker-1", 1, "300", "ValueError: batch 17 has NaN labels", "1/300ms")
	var ee *ExitError
	if err := <-pod1; !errors.As(err, &ee) || ee.Code != 1 {
		t.Fatalf("job-worker-1: %v, want exit 1", err)
	}
	if err := <-pod0; !errors.As(err, &ee) || ee.Failure.Code != kferrors.CodeJobStopped {
		t.Fatalf("job-worker-0: %v, want JobStopped", err)
	}
	r := readRootCause(t, dir)
	if got := r.RootCause; got.Failure.Worker != "job-worker-1" || !got.Time().Equal(time.Unix(sec, 300_000_000)) {
		t.Errorf("root cause %s %s at %s, want job-worker-1's at .300", got.Failure.Worker, got.Failure.Code, got.Time())
	}
	for _, d := range r.Others {
		if d.Failure.Worker == "job-worker-0" && !d.Time().Equal(time.Unix(sec, 400_000_000)) {
			t.Errorf("job-worker-0's document at %s, want .400", d.Time())
		}
	}
}

// Issue 27, item 2: two workers in one pod. Local rank 1 raised ValueError
// at .300; rank 0 failed 14 ms later with gloo's error in the same whole
// second, so torch (and flytekit) name rank 0. The pod's document carries
// rank 1's time and exception.
func TestCommandDocumentTakesEarliestLocalRank(t *testing.T) {
	dir := t.TempDir()
	sec := time.Now().Unix() + 2
	arg := strings.Join([]string{dir, strconv.FormatInt(sec, 10), "314", "RuntimeError: [gloo] Connection closed by peer [10.0.0.7]:33155",
		"0", "300", "ValueError: batch 17 has NaN labels"}, "|")
	cfg, out := helperConfig(t, 1, "pyflyte:"+arg)
	cfg.Launcher, cfg.Pod, cfg.ErrorPrefix = LauncherCommand, "job-worker-1", "file://"+dir
	cfg.Env = append(cfg.Env, "_F_WN=job-worker-1", "_F_DES=Earliest")
	if ee, _ := runBounded(t, t.Context(), cfg, 30*time.Second); ee != nil {
		t.Fatalf("%v, want exit 0 as flytekit\n%s", ee, out)
	}
	r := readRootCause(t, dir)
	got := r.RootCause
	if !got.Time().Equal(time.Unix(sec, 300_000_000)) || got.Failure.Code != "ValueError" {
		t.Errorf("document %s at %s, want rank 1's ValueError at .300\n%s", got.Failure.Code, got.Time(), out)
	}
	if msg := r.Message(); !strings.Contains(msg, "] ValueError: batch 17 has NaN labels\n") || !strings.Contains(msg, "Local rank 1") {
		t.Errorf("UI message: %s", msg)
	}
}

// Issue 31: a worker's known error text names the pod's failure. Local
// rank 1's CUDA ECC error at .300 is the root cause, not rank 0's NCCL
// watchdog timeout that torch named: the document is GpuEccUncorrectable,
// the system's and recoverable. And when torch names the rank whose text
// it is, flytekit's own root cause is read.
func TestCommandDocumentNamesHardwareFaults(t *testing.T) {
	ecc := "RuntimeError: CUDA error: uncorrectable ECC error encountered"
	// (No commas: the helper's modes are comma-separated.)
	watchdog := "RuntimeError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5 OpType=ALLREDUCE) ran for 600013 milliseconds before timing out."
	for _, c := range []struct {
		name string
		args []string
	}{
		{"an earlier rank", []string{"314", watchdog, "0", "300", ecc}},
		{"the rank torch named", []string{"300", ecc, "0", "314", watchdog}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			sec := time.Now().Unix() + 2
			arg := strings.Join(append([]string{dir, strconv.FormatInt(sec, 10)}, c.args...), "|")
			cfg, out := helperConfig(t, 1, "pyflyte:"+arg)
			cfg.Launcher, cfg.Pod, cfg.ErrorPrefix = LauncherCommand, "job-worker-1", "file://"+dir
			cfg.Env = append(cfg.Env, "_F_WN=job-worker-1", "_F_DES=Hardware")
			if ee, _ := runBounded(t, t.Context(), cfg, 30*time.Second); ee != nil {
				t.Fatalf("%v, want exit 0 as flytekit\n%s", ee, out)
			}
			got := readRootCause(t, dir).RootCause
			if got.Failure.Code != kferrors.CodeGpuEccUncorrectable || !got.Failure.Recoverable || got.Failure.Origin != core.ExecutionError_SYSTEM ||
				!got.Time().Equal(time.Unix(sec, 300_000_000)) || !strings.Contains(got.Failure.Message, ecc) {
				t.Errorf("document %s recoverable=%v %s at %s, want the ECC error at .300\n%s", got.Failure.Code, got.Failure.Recoverable,
					got.Failure.Origin, got.Time(), out)
			}
		})
	}
}
