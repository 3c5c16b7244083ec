package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/agent/refine"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Real flytekit (../shared/flytekit, 1.16.24, unpacked by scripts/deps.sh
// flytekit) at the seam, and beside it the stand-in: each "pod" is an
// agent in --launcher command (Run, as `kfelastic agent` runs it) whose
// command is pyflyte-execute as flytekit serializes a task
// (testdata/flytekit/real_task.py), or the stand-in
// (testdata/flytekit/elastic_task.py), with the env the plugin and the
// training operator give the pod; the two pods meet at a real master,
// which stops the job at the first failure reported. Only the Kubernetes
// around them is left out.

// flytekitClient is what runs in each pod: real flytekit or the stand-in.
type flytekitClient struct {
	// command is the pod's command line and its env, the pod's env with
	// the client's own; raise is "" or the local rank that raises
	// ValueError at step 20.
	command func(pod, dir, out, id string, nproc int, raise string, env []string) ([]string, []string)
	// raised is in the message of the ValueError raised.
	raised string
}

// realFlytekit is pyflyte-execute running real_task.train as flytekit
// serializes it.
func realFlytekit(t *testing.T, fk testenv.FlytekitEnv) flytekitClient {
	taskDir, err := filepath.Abs("../testdata/flytekit")
	if err != nil {
		t.Fatal(err)
	}
	return flytekitClient{raised: "loss is NaN at step 20", command: func(pod, dir, out, id string, nproc int, raise string, env []string) ([]string, []string) {
		inputs := filepath.Join(dir, "inputs.pb")
		// An empty file is an empty LiteralMap: the task takes no inputs.
		if err := os.WriteFile(inputs, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		argv := []string{fk.PyflyteExecute, "--inputs", inputs, "--output-prefix", "file://" + out,
			"--raw-output-data-prefix", "file://" + filepath.Join(dir, "raw"),
			"--checkpoint-path", "file://" + filepath.Join(dir, "ckpt", pod), "--prev-checkpoint", "",
			"--resolver", "flytekit.core.python_auto_container.default_task_resolver",
			"--", "task-module", "real_task", "task-name", "train"}
		// The task's knobs (real_task.py).
		env = append(fk.Env(env, taskDir), "NNODES=2", "NPROC_PER_NODE="+strconv.Itoa(nproc), "MONITOR_INTERVAL=1",
			"STEPS=60", "FAIL_STEP=20")
		if raise != "" {
			env = append(env, "FAIL_RANK="+raise)
		}
		return argv, env
	}}
}

// standinFlytekit is the stand-in with the same task: Elastic(nnodes=2,
// nproc_per_node, monitor_interval=1), 60 steps of 0.05 s.
//
// raiseArgs are the stand-in's arguments for the raising pod alone.
func standinFlytekit(t *testing.T, python string, raiseArgs ...string) flytekitClient {
	return flytekitClient{raised: "failed at step 20 on purpose", command: func(pod, dir, out, id string, nproc int, raise string, env []string) ([]string, []string) {
		argv := []string{python, standIn(t), "--output-prefix", "file://" + out, "--nnodes", "2",
			"--nproc-per-node", strconv.Itoa(nproc), "--monitor-interval", "1", "--steps", "60", "--sleep", "0.05",
			"--run-id", id}
		if raise != "" {
			argv = append(append(argv, "--raise-local", raise+":20:ValueError"), raiseArgs...)
		}
		return argv, env
	}}
}

// flytekitPod is one pod's agent and what it returned.
type flytekitPod struct {
	name string
	out  *syncBuffer
	err  error
}

// stopped says how the pod ended: "JobStopped" when the master stopped it,
// else "exited" (the command ended by itself).
func (p *flytekitPod) stopped() string {
	var ee *ExitError
	if errors.As(p.err, &ee) && ee.Failure.Code == kferrors.CodeJobStopped {
		return "JobStopped"
	}
	return "exited"
}

// runFlytekitJob runs one 2-pod job of the client's task with
// nproc_per_node workers per pod; the worker of local rank nproc-1 of
// job-worker-1 raises ValueError at step 20. It returns the two pods
// (job-worker-0, job-worker-1) and the documents' folder.
func runFlytekitJob(t *testing.T, c flytekitClient, nproc int, id string) ([]*flytekitPod, string) {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	endpoint, tokenFile := startMaster(t, master.Config{JobID: id, MinNodes: 2, MaxNodes: 2, WaitingTimeout: 100 * time.Millisecond})
	// A bound, not a timing: each pod starts three interpreters that
	// import torch and flytekit, on a loaded 2-core machine.
	ctx, cancel := context.WithTimeout(t.Context(), 240*time.Second)
	defer cancel()
	pods := []*flytekitPod{{name: "job-worker-0"}, {name: "job-worker-1"}}
	done := make(chan struct{}, len(pods))
	for rank, p := range pods {
		p.out = &syncBuffer{}
		raise := ""
		if p.name == "job-worker-1" {
			raise = strconv.Itoa(nproc - 1)
		}
		// What the pod's container has: the plugin's _F_WN/_F_DES,
		// flytepropeller's execution id, the training operator's PET_*,
		// and the client's own (PATH, PYTHONPATH, the task's knobs).
		// TMPDIR: flytekit's sandbox (flyte-*) and torch's run folders
		// (torchelastic_*) go with the test's folder.
		argv, env := c.command(p.name, dir, out, id, nproc, raise, append(os.Environ(), "TMPDIR="+dir, "_F_WN="+p.name, "_F_DES=Earliest",
			"FLYTE_INTERNAL_EXECUTION_ID="+id, "FLYTE_INTERNAL_EXECUTION_PROJECT=flytesnacks",
			"FLYTE_INTERNAL_EXECUTION_DOMAIN=development", "FLYTE_ATTEMPT_NUMBER=0",
			"PET_NNODES=2", "PET_RDZV_ENDPOINT="+endpoint, "PET_RDZV_BACKEND=c10d", "PET_RDZV_ID="+id,
			"PET_NPROC_PER_NODE="+strconv.Itoa(nproc), "PET_NODE_RANK="+strconv.Itoa(rank)))
		cfg := Config{
			Command: argv, Launcher: LauncherCommand, NProcPerNode: nproc, MinNodes: 2, MaxNodes: 2, NodeRank: rank,
			RdzvBackend: "c10d", RdzvEndpoint: endpoint, RdzvID: id, TokenFile: tokenFile,
			HeartbeatInterval: 200 * time.Millisecond, ErrorPrefix: "file://" + out, Pod: p.name,
			LogDir: t.TempDir(), StopGrace: 5 * time.Second, Tee: true, Stdout: p.out, Stderr: p.out,
			Logger: slog.New(slog.NewTextHandler(p.out, nil)), Env: env,
		}
		go func() {
			p.err = Run(ctx, cfg)
			done <- struct{}{}
		}()
	}
	for range pods {
		select {
		case <-done:
		case <-time.After(250 * time.Second):
			t.Fatalf("the pods did not end in 250 s:\n%s\n%s", pods[0].out, pods[1].out)
		}
	}
	return pods, out
}

// describe lists the documents under dir (worker, time, code, key) and
// what flytekit wrote that the agents moved to refined/.
func describe(t *testing.T, dir string) string {
	var b strings.Builder
	for _, sub := range []string{"", kferrors.RefinedPrefix} {
		paths, _ := filepath.Glob(filepath.Join(dir, sub, "error*.pb"))
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			f, err := kferrors.DecodeFailure(data, 32<<20)
			if err != nil {
				fmt.Fprintf(&b, "  %s: %v\n", p, err)
				continue
			}
			code, _ := outputreader.Shown(f.Code, f.Message)
			fmt.Fprintf(&b, "  %-14s %s %s (%s) %s\n", f.Worker, f.Time.UTC().Format(time.RFC3339Nano), code, f.Code,
				strings.TrimPrefix(p, dir+"/"))
		}
	}
	return b.String()
}

// Issue 27 with real flytekit: two pods of an Elastic task, one worker of
// job-worker-1 raises ValueError at step 20, every other worker then fails
// with gloo's "Connection closed by peer". Read as the plugin reads it
// (outputreader.Summarize), the root cause is job-worker-1's ValueError,
// in every one of 5 runs in a row: with one worker per pod, and with two
// (nproc_per_node=2, local rank 1 raises: torch and flytekit name rank 0,
// whose gloo error comes milliseconds later, in the same whole second or
// the next, item 2). Whichever pod
// reports first, the master stops the other (item 1): flytekit takes 1 to
// 2 s from its document to its exit, so the master's EXIT mostly finds the
// other pod's document written and its flytekit still running. Each run
// logs which pod the master stopped. Before issue 27's agent fixes
// (afe07d7) this named job-worker-1's ValueError in 1 of 5 runs with one
// worker per pod and in none with two.
func TestRealFlytekitRootCause(t *testing.T) {
	t.Parallel()
	fk := testenv.Flytekit(t)
	c := realFlytekit(t, fk)
	for _, nproc := range []int{1, 2} {
		t.Run(fmt.Sprintf("nproc%d", nproc), func(t *testing.T) { rootCauseRuns(t, c, nproc, "fk", *rootCauseRunsFlag) })
	}
}

// The same with the stand-in (testdata/flytekit/elastic_task.py), which
// needs no flytekit (≈17 s a run here, real flytekit ≈38 s): it must fail
// where real flytekit fails, so it waits after its document as flytekit
// does (--exit-delay). Without the wait the master's EXIT never found a
// pod with its document written and its command running, and item 1 went
// unseen: before issue 27's agent fixes (afe07d7) this test's nproc1 named
// the right pod in 5 of 5 runs without the wait, 3 of 5 with it.
func TestStandinRootCause(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real torch workers: skipped with -short")
	}
	// Real flytekit runs on torch 1.13 only: Debian sid, where torch 2.14
	// is, lacks packages flytekit 1.16.24 imports (dataclasses-json,
	// marshmallow-enum). The stand-in runs on both; on 2.x with two
	// workers per pod, the case where torch names the wrong rank.
	for _, tc := range testenv.Torches(t) {
		c := standinFlytekit(t, tc.Python)
		nprocs := []int{1, 2}
		if tc.Version != "1.13" {
			nprocs = []int{2}
		}
		for _, nproc := range nprocs {
			t.Run(fmt.Sprintf("%s/nproc%d", tc.Name(), nproc), func(t *testing.T) { rootCauseRuns(t, c, nproc, "si", *rootCauseRunsFlag) })
		}
	}
}

// Issue 27, item 4, with a real master: the raising worker's exception
// text is 2 MB (a tensor printed whole), so the stand-in, as flytekit,
// writes a document over the reader's 1 MiB limit and exits 0. The agent
// rewrites it under the limit, the pod does not count as succeeded, and
// the root cause is still job-worker-1's ValueError (its message capped
// head and tail).
func TestStandinRootCauseOversizedDocument(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real torch workers: skipped with -short")
	}
	tc, why := testenv.TorchFor("1.13")
	if why != "" {
		t.Skip(why)
	}
	c := standinFlytekit(t, tc.Python, "--message-bytes", "2000000")
	rootCauseRuns(t, c, 1, "big", 1)
}

// rootCauseRuns flag: how many runs in a row each root-cause variant
// makes. make test runs one of each: the five variants already cover both
// orders in which the pods end (the outputs say which), and a second run
// of each cost ≈3 min of the suite on 2 cores (issue 26's budget). The
// root-cause issue's acceptance is -rootcause.runs=5, measured 5 of 5 in
// every variant: go test ./agent -run RootCause -rootcause.runs=5.
var rootCauseRunsFlag = flag.Int("rootcause.runs", 1, "runs in a row of each TestRealFlytekitRootCause/TestStandinRootCause variant")

// rootCauseRuns runs the job runs times in a row and wants job-worker-1's
// ValueError as the root cause each time.
func rootCauseRuns(t *testing.T, c flytekitClient, nproc int, name string, runs int) {
	right := 0
	for i := 1; i <= runs; i++ {
		start := time.Now()
		pods, dir := runFlytekitJob(t, c, nproc, fmt.Sprintf("%s%d%d", name, nproc, i))
		s, err := outputreader.Summarize(t.Context(), bucketSource(t, dir), nil)
		if err != nil || s.RootCause == nil {
			t.Errorf("run %d: Summarize: %v, %+v\n%s\n%s", i, err, s, pods[0].out, pods[1].out)
			continue
		}
		root := s.RootCause
		code, _ := outputreader.Shown(root.Failure.Code, root.Failure.Message)
		how := fmt.Sprintf("job-worker-0 %s, job-worker-1 %s, %.1f s", pods[0].stopped(), pods[1].stopped(),
			time.Since(start).Seconds())
		if root.Failure.Worker != "job-worker-1" || code != "ValueError" || !strings.Contains(root.Failure.Message, c.raised) {
			t.Errorf("run %d (%s): root cause %s %s, want job-worker-1's ValueError; UI message:\n%s\ndocuments:\n%s\njob-worker-0:\n%s\njob-worker-1:\n%s",
				i, how, root.Failure.Worker, code, s.Message(), describe(t, dir), pods[0].out, pods[1].out)
			continue
		}
		right++
		head, _, _ := strings.Cut(s.Message(), "\n")
		t.Logf("run %d (%s): %s\ndocuments:\n%s", i, how, head, describe(t, dir))
	}
	t.Logf("%d of %d runs named job-worker-1's ValueError", right, runs)
}

// bucketSource opens the file:// prefix dir for the reader.
func bucketSource(t *testing.T, dir string) outputreader.Source {
	t.Helper()
	b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return outputreader.NewBucketSource(b)
}

// torch 1.13 names the worker its join found first, not the earliest: in a
// TestRealFlytekitRootCause run local rank 1 raised ValueError in the
// second before the one torch (and so flytekit) named for local rank 0's
// gloo error. The earlier file of the same attempt wins all the same; a
// file dated past torch's second does not.
func TestRefineTakesEarlierSecond(t *testing.T) {
	sec := time.Unix(1796545144, 0)
	named := "/tmp/torchelastic_x/run/attempt_0/0/error.json"
	f := kferrors.Failure{Code: "USER:RuntimeError", Worker: "job-worker-1", Time: sec,
		Message: "Root Cause (first observed failure):\n  error_file: " + named + "\n  RuntimeError: [gloo] Connection closed by peer"}
	gloo := refine.RankError{LocalRank: 0, Path: named, Err: &kferrors.TorchError{
		Message: "RuntimeError: [gloo] Connection closed by peer", Time: sec.Add(35 * time.Millisecond)}}
	raised := refine.RankError{LocalRank: 1, Path: "/tmp/torchelastic_x/run/attempt_0/1/error.json", Err: &kferrors.TorchError{
		Message: "ValueError: loss is NaN", Time: sec.Add(-20 * time.Millisecond)}}
	got, how := refine.FromErrorFiles(f, []refine.RankError{gloo, raised})
	if got.Code != "ValueError" || !got.Time.Equal(raised.Err.Time) || !strings.Contains(how, "local rank 1") {
		t.Errorf("refined %s at %s (%s), want local rank 1's ValueError at %s", got.Code, got.Time, how, raised.Err.Time)
	}
	raised.Err.Time = sec.Add(time.Second + 20*time.Millisecond) // past torch's second
	got, how = refine.FromErrorFiles(f, []refine.RankError{gloo, raised})
	if got.Code != f.Code || !got.Time.Equal(gloo.Err.Time) || how != "time" {
		t.Errorf("refined %s at %s (%s), want the named rank's time only", got.Code, got.Time, how)
	}
}
