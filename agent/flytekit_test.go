package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Real flytekit (../shared/flytekit, 1.16.24, unpacked by scripts/deps.sh
// flytekit) at the seam, not the stand-in: each "pod" is an agent in
// --launcher command (Run, as `kfelastic agent` runs it) whose command is
// pyflyte-execute as flytekit serializes a task
// (testdata/flytekit/real_task.py), with the env the plugin and the
// training operator give the pod; the two pods meet at a real master,
// which stops the job at the first failure reported. Only the Kubernetes
// around them is left out.

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

// runRealFlytekitJob runs one 2-pod job of real_task.train with
// nproc_per_node workers per pod; the worker of local rank nproc-1 of
// job-worker-1 raises ValueError at step 20. It returns the two pods
// (job-worker-0, job-worker-1) and the documents' folder.
func runRealFlytekitJob(t *testing.T, fk testenv.FlytekitEnv, nproc int, id string) ([]*flytekitPod, string) {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	inputs := filepath.Join(dir, "inputs.pb")
	// An empty file is an empty LiteralMap: the task takes no inputs.
	if err := os.WriteFile(inputs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	endpoint, tokenFile := startMaster(t, master.Config{JobID: id, MinNodes: 2, MaxNodes: 2, WaitingTimeout: 100 * time.Millisecond})
	taskDir, err := filepath.Abs("../testdata/flytekit")
	if err != nil {
		t.Fatal(err)
	}
	// A bound, not a timing: each pod starts three interpreters that
	// import torch and flytekit, on a loaded 2-core machine.
	ctx, cancel := context.WithTimeout(t.Context(), 240*time.Second)
	defer cancel()
	pods := []*flytekitPod{{name: "job-worker-0"}, {name: "job-worker-1"}}
	done := make(chan struct{}, len(pods))
	for rank, p := range pods {
		p.out = &syncBuffer{}
		// What the pod's container has: the plugin's _F_WN/_F_DES,
		// flytepropeller's execution id, the training operator's PET_*,
		// and the task's knobs (real_task.py).
		env := fk.Env(os.Environ(), taskDir)
		env = append(env, "_F_WN="+p.name, "_F_DES=Earliest",
			"FLYTE_INTERNAL_EXECUTION_ID="+id, "FLYTE_INTERNAL_EXECUTION_PROJECT=flytesnacks",
			"FLYTE_INTERNAL_EXECUTION_DOMAIN=development", "FLYTE_ATTEMPT_NUMBER=0",
			"PET_NNODES=2", "PET_RDZV_ENDPOINT="+endpoint, "PET_RDZV_BACKEND=c10d", "PET_RDZV_ID="+id,
			"PET_NPROC_PER_NODE="+strconv.Itoa(nproc), "PET_NODE_RANK="+strconv.Itoa(rank),
			"NNODES=2", "NPROC_PER_NODE="+strconv.Itoa(nproc), "MONITOR_INTERVAL=1", "STEPS=60", "FAIL_STEP=20")
		if p.name == "job-worker-1" {
			env = append(env, "FAIL_RANK="+strconv.Itoa(nproc-1))
		}
		cfg := Config{
			Command: []string{fk.PyflyteExecute, "--inputs", inputs, "--output-prefix", "file://" + out,
				"--raw-output-data-prefix", "file://" + filepath.Join(dir, "raw"),
				"--checkpoint-path", "file://" + filepath.Join(dir, "ckpt", p.name), "--prev-checkpoint", "",
				"--resolver", "flytekit.core.python_auto_container.default_task_resolver",
				"--", "task-module", "real_task", "task-name", "train"},
			Launcher: LauncherCommand, NProcPerNode: nproc, MinNodes: 2, MaxNodes: 2, NodeRank: rank,
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
// whose gloo error comes in the same whole second, item 2). Whichever pod
// reports first, the master stops the other (item 1): each run logs which
// pod the master stopped.
func TestRealFlytekitRootCause(t *testing.T) {
	fk := testenv.Flytekit(t)
	for _, nproc := range []int{1, 2} {
		t.Run(fmt.Sprintf("nproc%d", nproc), func(t *testing.T) {
			const runs = 5
			right := 0
			for i := 1; i <= runs; i++ {
				start := time.Now()
				pods, dir := runRealFlytekitJob(t, fk, nproc, fmt.Sprintf("fk%d%d", nproc, i))
				s, err := outputreader.Summarize(t.Context(), bucketSource(t, dir), nil)
				if err != nil || s.RootCause == nil {
					t.Errorf("run %d: Summarize: %v, %+v\n%s\n%s", i, err, s, pods[0].out, pods[1].out)
					continue
				}
				root := s.RootCause
				code, _ := outputreader.Shown(root.Failure.Code, root.Failure.Message)
				how := fmt.Sprintf("job-worker-0 %s, job-worker-1 %s, %.1f s", pods[0].stopped(), pods[1].stopped(),
					time.Since(start).Seconds())
				if root.Failure.Worker != "job-worker-1" || code != "ValueError" ||
					!strings.Contains(root.Failure.Message, "loss is NaN at step 20") {
					t.Errorf("run %d (%s): root cause %s %s, want job-worker-1's ValueError; UI message:\n%s\ndocuments:\n%s\njob-worker-0:\n%s\njob-worker-1:\n%s",
						i, how, root.Failure.Worker, code, s.Message(), describe(t, dir), pods[0].out, pods[1].out)
					continue
				}
				right++
				head, _, _ := strings.Cut(s.Message(), "\n")
				t.Logf("run %d (%s): %s\ndocuments:\n%s", i, how, head, describe(t, dir))
			}
			t.Logf("%d of %d runs named job-worker-1's ValueError", right, runs)
		})
	}
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
