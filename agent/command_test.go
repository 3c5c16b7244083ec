package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
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
		"PET_MAX_RESTARTS=", "PYTHONUNBUFFERED=0", "PATH=/bin"}
	got := CommandEnv(base, commandSpec{cfg: cfg, rdzvEndpoint: "127.0.0.1:4242", errorFile: "/e", progressFile: "/p", mark: "a/1"})
	want := []string{"KFELASTIC_AGENT=a/1", "KFELASTIC_PROGRESS_FILE=/p", "PATH=/bin", "PET_MAX_RESTARTS=2",
		"PET_NNODES=2:3", "PET_NODE_RANK=1", "PET_NPROC_PER_NODE=4", "PET_RDZV_ENDPOINT=127.0.0.1:4242",
		"PET_RDZV_ID=job", "PYTHONUNBUFFERED=0", "TORCHELASTIC_ERROR_FILE=/e", "_F_DES=Earliest", "_F_WN=pod-1"}
	if !slices.Equal(got, want) {
		t.Errorf("CommandEnv:\n got %q\nwant %q", got, want)
	}
	// Without a relay (no master) the endpoint is the pod's, or the flag's.
	got = CommandEnv(nil, commandSpec{cfg: cfg})
	if !slices.Contains(got, "PET_RDZV_ENDPOINT=master:29400") || slices.ContainsFunc(got, func(s string) bool {
		return strings.HasPrefix(s, "RANK=") || strings.HasPrefix(s, "_F_WN=")
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

func freePortT(t *testing.T) int {
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
