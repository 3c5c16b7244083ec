package agent

import (
	"context"
	"errors"
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

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master"
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
		"PET_RDZV_CONF=last_call_timeout=1,is_host=false", "PET_RDZV_ENDPOINT=127.0.0.1:4242", "PET_RDZV_ID=job", "PYTHONUNBUFFERED=0", "TORCHELASTIC_ERROR_FILE=/e", "_F_DES=Earliest", "_F_WN=pod-1"}
	if !slices.Equal(got, want) {
		t.Errorf("CommandEnv:\n got %q\nwant %q", got, want)
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
	needTorch(t)
	cfg, out := torchConfig(t, 2)
	cfg.Launcher = LauncherCommand
	cfg.Command = []string{python, standIn(t), "--steps", "15", "--sleep", "0.01"}
	cfg.Env = append(os.Environ(), fmt.Sprintf("PET_RDZV_ENDPOINT=127.0.0.1:%d", freePortT(t)), "OMP_NUM_THREADS=1")
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
	needTorch(t)
	cfg, out := torchConfig(t, 2)
	cfg.Launcher = LauncherCommand
	cfg.DumpSignal, cfg.DumpTimeout = syscall.SIGUSR1, 3*time.Second
	docs := t.TempDir()
	cfg.ErrorPrefix = "file://" + docs
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	cfg.Command = []string{python, standIn(t), "--steps", "100000", "--sleep", "0.02", "--ckpt", ckpt}
	cfg.Env = append(os.Environ(), fmt.Sprintf("PET_RDZV_ENDPOINT=127.0.0.1:%d", freePortT(t)), "OMP_NUM_THREADS=1")
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
// command and exits 1 with the master's code.
func TestCommandMasterExitStopsChild(t *testing.T) {
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 2, MaxNodes: 2, WaitingTimeout: 100 * time.Millisecond})
	doneA, outA := commandAgent(t, t.Context(), endpoint, tokenFile, "pod-a", 0, 2, "hang")
	doneB, outB := commandAgent(t, t.Context(), endpoint, tokenFile, "pod-b", 1, 2, "exitlater:1")
	waitFor(t, outA, "[default0]:helper hang", 5*time.Second)
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
	if alive(pid) {
		t.Errorf("the command %d of the stopped job lives on", pid)
	}
}

func freePortT(t *testing.T) int {
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A command whose main is under torch's @record (torchrun's is) writes its
// exception to the TORCHELASTIC_ERROR_FILE the agent gives it, and the
// pod's document has that exception, not only an exit code. (torch 1.13's
// torchrun itself fails on this Python before any worker starts, so the
// command here is a script with @record.)
func TestCommandRealTorchErrorFile(t *testing.T) {
	needTorch(t)
	cfg, out := torchConfig(t, 2)
	cfg.Launcher = LauncherCommand
	cfg.Command = []string{python, "-c", `from torch.distributed.elastic.multiprocessing.errors import record

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
