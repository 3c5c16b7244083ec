package local

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// The scenarios of docs/DESIGN.md §8, end to end: the real kfelastic binary as
// each pod's agent, real torch.distributed workers (gloo, Debian's torch at
// /usr/bin/python3) running the bundled example, real signals, cgroups and
// the real master in-process. Nothing is faked. Scenarios 8–10 (TensorFlow
// PS jobs, on a stand-in) are in tfjob_test.go; 11 (--launcher command with
// torch's own elastic_launch, the flytekit stand-in) is below, and 12's
// blackout measurement belongs here too, next to TestKillMaster. Scenarios
// 11 and 12, where torch's own launcher and store meet the agent and the
// master, run once per torch: 1.13, and 2.14 (Python 3.14) when
// scripts/deps.sh torch2 has built it (testenv.Torches). Scenarios 1 and 7
// run on 1.13 and 5 on 2.14 (onTorch; KFELASTIC_TORCH_ALL=1 runs them on
// both): their subject is the engine's and the master's decisions, and the
// agent's own tests hold both torches to its restarts.

// python is Debian's, with torch 1.13: the scenarios that run on one torch.
const python = "/usr/bin/python3"

// forEachTorch runs f as a subtest per torch here, py its interpreter.
func forEachTorch(t *testing.T, f func(t *testing.T, py string)) {
	t.Helper()
	testenv.ForEachTorch(t, func(t *testing.T, tc testenv.Torch) { f(t, tc.Python) })
}

// onTorch runs f on one torch, prefer when it is here (testenv.OnTorch):
// for the scenarios whose subject is the engine's and the master's
// decisions, not the seam with torch.
func onTorch(t *testing.T, prefer string, f func(t *testing.T, py string)) {
	t.Helper()
	testenv.OnTorch(t, prefer, func(t *testing.T, tc testenv.Torch) { f(t, tc.Python) })
}

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// needTorchAt skips the test when py cannot import torch.distributed: the
// torch a job's workers run on, which is not always Debian's
// ($KFELASTIC_TORCH).
func needTorchAt(t *testing.T, py string) {
	t.Helper()
	if err := testenv.TorchImports(py); err != nil {
		t.Skipf("%s has no torch (scripts/deps.sh torch): %v", py, err)
	}
}

// kfelasticBinary builds the binary the pods run, once per test run.
func kfelasticBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a whole job: real agents and torch workers")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kfelastic-local-test")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "kfelastic")
		if out, err := testenv.StaticBuild(context.Background(), binary, "./cmd/kfelastic").CombinedOutput(); err != nil {
			buildErr = err
			binary = string(out)
		}
	})
	if buildErr != nil {
		t.Fatalf("go build: %v\n%s", buildErr, binary)
	}
	return binary
}

// syncBuffer is the view's writer, read while the job runs.
type syncBuffer = testenv.SyncBuffer

// job is one finished local job of a test.
type job struct {
	t    *testing.T
	res  *Result
	view string
	out  string
}

// runJob runs the example script under the engine with opts (the
// command, binary, output and short timeouts filled in) and steps steps.
func runJob(t *testing.T, opts Options, steps int, chaos ...string) *job {
	t.Helper()
	return runJobOn(t, python, opts, steps, chaos...)
}

// runJobOn is runJob with py running the example script.
func runJobOn(t *testing.T, py string, opts Options, steps int, chaos ...string) *job {
	t.Helper()
	opts.Binary = kfelasticBinary(t)
	needTorchAt(t, py)
	opts.Out = t.TempDir()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "examples", "train", "train.py")
	if opts.Command == nil {
		opts.Command = []string{py, script, "--steps", strconv.Itoa(steps), "--sleep", "0.05", "--ckpt-every", "5",
			"--ckpt-dir", filepath.Join(opts.Out, "ckpt")}
	}
	if opts.Job == "" {
		opts.Job = "job"
	}
	if opts.MaxRestarts == 0 {
		opts.MaxRestarts = 2
	}
	if opts.Grace == 0 {
		opts.Grace = 3 * time.Second
	}
	for _, s := range chaos {
		c, err := ParseChaos(s)
		if err != nil {
			t.Fatal(err)
		}
		opts.Chaos = append(opts.Chaos, c)
	}
	view := &syncBuffer{}
	opts.View = view
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := Run(ctx, opts)
	t.Logf("job ran %s", time.Since(start).Round(time.Millisecond))
	j := &job{t: t, res: res, view: view.String(), out: opts.Out}
	t.Logf("view:\n%s", j.view)
	if res != nil {
		t.Logf("recovery after each fault: %v", res.Recovery)
	}
	if err != nil {
		j.dump()
		t.Fatal(err)
	}
	return j
}

// dump logs what a failed scenario needs to be understood.
func (j *job) dump() {
	j.t.Helper()
	j.t.Logf("view:\n%s", j.view)
	logs, _ := filepath.Glob(filepath.Join(j.out, "pods", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if len(b) > 6000 {
			b = append(b[:2000], append([]byte("\n…\n"), b[len(b)-4000:]...)...)
		}
		j.t.Logf("%s:\n%s", filepath.Base(l), b)
	}
	if b, err := os.ReadFile(filepath.Join(j.out, "master.log")); err == nil {
		var keep []string
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.Contains(line, "component=master") && !strings.Contains(line, "level=DEBUG") {
				keep = append(keep, line)
			}
		}
		j.t.Logf("master.log:\n%s", strings.Join(keep, "\n"))
	}
}

func (j *job) podLog(pod string) string {
	b, _ := os.ReadFile(filepath.Join(j.out, "pods", pod+".log"))
	return string(b)
}

// expect fails the test unless the view (or a pod's log) matches.
func (j *job) expect(what, text, pattern string) []string {
	j.t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(text)
	if m == nil {
		j.dump()
		j.t.Fatalf("%s: no match for %q", what, pattern)
	}
	return m
}

func (j *job) succeeded() {
	j.t.Helper()
	if !j.res.Succeeded {
		j.dump()
		j.t.Fatalf("the job failed: %s / %s", j.res.Message, j.res.Stopped)
	}
}

// resumed checks that a pod's workers resumed from a checkpoint past 0 and
// trained on from there.
func (j *job) resumed(pod string) {
	j.t.Helper()
	log := j.podLog(pod)
	m := j.expect(pod+" resumed", log, `resumed from step ([1-9]\d*)`)
	from, _ := strconv.Atoi(m[1])
	j.expect(pod+" trained on", log, `step = `+strconv.Itoa(from)+`\b`)
}

// Scenario 1: a worker pod is deleted (preempted): a new pod with the next
// index and the same rank starts, not counted against the budget, and
// training continues from the checkpoint.
func TestScenario1DeletePod(t *testing.T) {
	onTorch(t, "1.13", scenario1DeletePod)
}

func scenario1DeletePod(t *testing.T, py string) {
	j := runJobOn(t, py, Options{MinNodes: 2, MaxNodes: 3, NProcPerNode: 1}, 40, "delete-pod:1@step=8")
	j.succeeded()
	j.expect("deletion", j.view, `delete-pod: SIGTERM to job-worker-1`)
	j.expect("replacement", j.view, `job-worker-3 replaces job-worker-1 as rank 1 after Preempted \(relaunch, not counted\)`)
	j.expect("replacement's round", j.podLog("job-worker-3"), `(?s)Rendezvous complete.*group_world_size=3`)
	j.resumed("job-worker-3")
	// The replacement's round is the recovery: the Preempted document is
	// moved aside (superseded/), so the job that succeeded has no failure.
	j.expect("recovered", j.view, `job-worker-1's failure is recovered \(job-worker-3 trains in its place\)`)
	if j.res.Message != "" {
		t.Errorf("a recovered failure is still the root cause: %q", j.res.Message)
	}
}

// Scenario 5: a training process is kill -9ed: its agent restarts the
// local group in place (restart_count=1); the pod does not fail and no pod
// is relaunched.
func TestScenario5KillWorker(t *testing.T) {
	onTorch(t, "2.14", scenario5KillWorker)
}

func scenario5KillWorker(t *testing.T, py string) {
	j := runJobOn(t, py, Options{MinNodes: 2, MaxNodes: 2, NProcPerNode: 2}, 40, "kill-worker:1/1@step=8")
	j.succeeded()
	j.expect("kill", j.view, `kill-worker: kill -9 of job-worker-1's local rank 1 \(pid \d+\)`)
	j.expect("in-place restart", j.podLog("job-worker-1"), `(?s)restart_count=1\n.*resumed from step [1-9]`)
	if strings.Contains(j.view, "replaces") || len(j.res.Pods) != 2 {
		t.Errorf("a pod was relaunched: %+v", j.res.Pods)
	}
}

// Scenario 6: scale up. 3 of 4 pods can start (3 slots): training starts
// with group_world_size=3; a slot frees, the 4th pod starts, and training
// restarts with 4, not counted against the pods' budget. (DLRover's agent
// prints restart_count=1 there; this agent keeps torchrun's count, which a
// membership change does not raise, so the test asserts the round change
// itself: docs/DESIGN.md §8.)
func TestScenario6AddSlot(t *testing.T) {
	j := runJob(t, Options{MinNodes: 3, MaxNodes: 4, NProcPerNode: 1, Slots: 3}, 40, "add-slot@step=8")
	j.succeeded()
	j.expect("4th pod pending then started", j.view, `(?s)add-slot: 4 slots.*job-worker-3 started: rank 3`)
	log := j.podLog("job-worker-0")
	j.expect("round of 3 then 4", log, `(?s)group_world_size=3.*the master outdates this node's round.*group_world_size=4`)
	j.resumed("job-worker-3")
}

// Scenario 7: scale down. One of 4 pods fails for good (its machine dies,
// and so does its replacement): the relaunch budget is spent, and training
// restarts with 3 from its checkpoint.
func TestScenario7FailPod(t *testing.T) {
	onTorch(t, "1.13", scenario7FailPod)
}

func scenario7FailPod(t *testing.T, py string) {
	j := runJobOn(t, py, Options{MinNodes: 3, MaxNodes: 4, NProcPerNode: 1, MaxRelaunches: 1}, 40, "fail-pod:3@step=8")
	j.succeeded()
	j.expect("failure", j.view, `fail-pod: job-worker-3's machine fails`)
	j.expect("replacement fails too", j.view, `job-worker-4 replaces job-worker-3 as rank 3 after NodeLost \(relaunch-avoid-host, counted\)(?s).*job-worker-4, rank 3's replacement, fails too`)
	j.expect("not relaunched again", j.view, `job-worker-4 \(rank 3\) is not relaunched after NodeLost: rank relaunched 1 times already`)
	m := j.expect("a round of 3 after the loss", j.podLog("job-worker-0"), `(?s)group_world_size=4.*group_world_size=3\n(?:.*\n)*?.*resumed from step (\d+)`)
	if m[1] == "0" {
		t.Errorf("the round of 3 started from step 0, not from the checkpoint")
	}
}

// Scenario 12 (in part): the master stops and restarts with its state:
// training goes on in the same round, no pod restarts.
func TestKillMaster(t *testing.T) {
	forEachTorch(t, killMaster)
}

func killMaster(t *testing.T, py string) {
	j := runJobOn(t, py, Options{MinNodes: 2, MaxNodes: 2, NProcPerNode: 1}, 60, "kill-master@step=8")
	j.succeeded()
	m := j.expect("restart", j.view, `kill-master: master back on \S+ after (\S+)`)
	t.Logf("master blackout: %s", m[1])
	for _, pod := range []string{"job-worker-0", "job-worker-1"} {
		if n := strings.Count(j.podLog(pod), "Rendezvous complete"); n != 1 {
			t.Errorf("%s: %d rounds, want 1 (the master's restart is a pause)", pod, n)
		}
	}
	j.expect("training after the restart", j.podLog("job-worker-0"), `step = 5\d`)
}

// Scenario 3: a pod is on a faulty machine: its health-check process is
// killed in every round; it fails both rounds, exits with a
// NodeCheckFailed document, and its replacement passes and trains.
func TestScenario3BreakCheck(t *testing.T) {
	j := runJob(t, Options{MinNodes: 2, MaxNodes: 3, NProcPerNode: 1, NetworkCheck: true, CheckTimeout: 30 * time.Second}, 120, "break-check:1")
	j.succeeded()
	j.expect("check killed", j.view, `break-check: killed job-worker-1's check process`)
	j.expect("replacement", j.view, `job-worker-3 replaces job-worker-1 as rank 1 after NodeCheckFailed \(relaunch-avoid-host, counted\)`)
	master, _ := os.ReadFile(filepath.Join(j.out, "master.log"))
	j.expect("check rounds logged", string(master), `Round 2: The node status are`)
	j.expect("replacement trains", j.podLog("job-worker-3"), `step = \d+`)
	j.expect("recovered", j.view, `job-worker-1's failure is recovered`)
	docs, _ := filepath.Glob(filepath.Join(j.out, "errors", "superseded", "error-*job-worker-1*.pb"))
	if len(docs) == 0 {
		t.Errorf("job-worker-1's NodeCheckFailed document is not under superseded/")
	}
}

// Scenario 2: a straggler (its CPU throttled): the health check finds it
// slower than twice the others' median; with exclude-straggler it exits
// with a Straggler document, and its replacement passes.
func TestScenario2Straggler(t *testing.T) {
	j := runJob(t, Options{MinNodes: 2, MaxNodes: 3, NProcPerNode: 1, NetworkCheck: true, ExcludeStraggler: true}, 120, "straggler:2")
	j.succeeded()
	j.expect("throttled", j.view, `straggler: job-worker-2 (throttled|is paused)`)
	j.expect("replacement", j.view, `job-worker-3 replaces job-worker-2 as rank 2 after Straggler`)
	master, _ := os.ReadFile(filepath.Join(j.out, "master.log"))
	j.expect("elapsed times logged", string(master), `The node elapsed time are`)
	j.expect("recovered", j.view, `job-worker-2's failure is recovered`)
	j.expect("replacement trains", j.podLog("job-worker-3"), `step = \d+`)
}

// Scenario 9, on PyTorch: a pod goes past its memory limit and is
// OOMKilled as a whole; the master relaunches its rank with twice the
// memory, enforced by the same mechanism.
func TestOOMDoublesMemory(t *testing.T) {
	// 200 steps (10 s): the allocation reaches the limit seconds after it
	// starts on a loaded machine, and a job of 40 steps had ended by then,
	// its replacement resuming at the last step with nothing left to train.
	j := runJob(t, Options{MinNodes: 2, MaxNodes: 2, NProcPerNode: 1, Memory: 768 << 20}, 200, "oom:1@step=8")
	j.succeeded()
	j.expect("allocation", j.view, `oom: a process in job-worker-1's cgroup allocates past its limit of 768 MiB`)
	j.expect("relaunch", j.view, `job-worker-2 replaces job-worker-1 as rank 1 after OOMKilled \(relaunch-more-memory, counted, memory 768 MiB → 1.5 GiB \(cgroup v\d\)\)`)
	j.expect("replacement's limit", j.view, `job-worker-2 started: rank 1, pid \d+, memory 1.5 GiB`)
	j.resumed("job-worker-2")
	// The OOMKilled pod's document (its agent died with it, so the engine
	// writes it, as the plugin synthesizes one from a pod status) is moved
	// aside once the replacement trains.
	j.expect("recovered", j.view, `job-worker-1's failure is recovered`)
}

// Scenario 4: a pod's network breaks mid-training: the master no longer
// hears it and declares it lost after the heartbeat timeout, its peers are
// told to restart, a replacement takes its rank, and training resumes from
// the checkpoint. 120 steps: the peers, whose restart is a fork (the
// agent's fork server), must still be training when the replacement has
// started and joins.
// As root the pods have network namespaces and the cut is a link taken
// down; "host" is what happens elsewhere: the pod is frozen.
func TestScenario4CutNetwork(t *testing.T) {
	for _, network := range []string{"netns", "host"} {
		t.Run(network, func(t *testing.T) {
			if network == "netns" && os.Geteuid() != 0 {
				t.Skip("network namespaces need root")
			}
			j := runJob(t, Options{MinNodes: 2, MaxNodes: 3, NProcPerNode: 1, Network: network}, 120, "cut-network:2@step=8")
			j.succeeded()
			want := map[string]string{"netns": `cut-network: job-worker-2's link is down`, "host": `cut-network: job-worker-2 is frozen`}[network]
			j.expect("cut", j.view, want)
			j.expect("lost, replaced", j.view, `job-worker-3 replaces job-worker-2 as rank 2 after NodeLost`)
			j.resumed("job-worker-3")
		})
	}
}

// Scenario 11: under --launcher command each pod runs torch's own
// elastic_launch (the flytekit stand-in, testdata/flytekit/elastic_task.py,
// as flytekit's Elastic task calls it), and job-worker-0 is deleted mid-
// training. Upstream, node 0's torch agent hosts the c10d store and its loss
// loses the job; here every pod's torch agent is a client of its own
// agent's loopback relay to the master's store, so the replacement
// (job-worker-3, rank 0) and the survivors' torch agents meet again in one
// 3-wide rendezvous — they share no port, only the master — and the workers
// resume from the checkpoint. Each agent runs its command once: torch
// restarts the workers inside it.
func TestScenario11DeleteWorker0Command(t *testing.T) {
	forEachTorch(t, scenario11DeleteWorker0Command)
}

func scenario11DeleteWorker0Command(t *testing.T, py string) {
	_, file, _, _ := runtime.Caller(0)
	standIn := filepath.Join(filepath.Dir(file), "..", "testdata", "flytekit", "elastic_task.py")
	// 120 steps of 50 ms: the survivors' workers fail when worker 0's go,
	// and their torch agents wait in the rendezvous for the replacement.
	cmd := []string{py, standIn, "--output-prefix", t.TempDir(), "--nnodes", "2:3", "--steps", "120", "--sleep", "0.05", "--ckpt", filepath.Join(t.TempDir(), "ckpt"),
		"--max-restarts", "3", "--monitor-interval", "1", "--run-id", "job", "--rdzv-conf", "last_call_timeout=1"}
	j := runJobOn(t, py, Options{MinNodes: 2, MaxNodes: 3, NProcPerNode: 1, Launcher: "command", Command: cmd}, 120, "delete-pod:0@step=10")
	j.succeeded()
	j.expect("deletion", j.view, `delete-pod: SIGTERM to job-worker-0`)
	j.expect("replacement", j.view, `job-worker-3 replaces job-worker-0 as rank 0 after Preempted \(relaunch, not counted\)`)
	r := j.podLog("job-worker-3")
	j.expect("replacement's command on its relay", r, `command started" .*group_rank=0 group_world_size=3 rdzv_endpoint=127\.0\.0\.1:\d+`)
	j.expect("replacement finished", r, `\[default0\]:step = 119\n`)
	_, world, start := lastRestart(r)
	if world != 3 || start < 1 {
		j.dump()
		t.Fatalf("the replacement trained in a world of %d from step %d, want 3 from a checkpoint", world, start)
	}
	for _, pod := range []string{"job-worker-1", "job-worker-2"} {
		log := j.podLog(pod)
		// torch's agent restarted its workers into the replacement's round:
		// they read the same checkpoint. (A first round of 2, when one
		// pod's torch came up late, is a restart too.) torch counts in
		// TORCHELASTIC_RESTART_COUNT only the restarts after a failure: a
		// torch agent that finds a node waiting before it finds its
		// workers failed (their peer gone) restarts them uncounted. A pod
		// whose torch came up after that first round of 2 had formed (a
		// loaded machine) starts its one group in the replacement's round:
		// the check below, a 3-wide group from the checkpoint, holds for it.
		groups := len(restartRE.FindAllString(log, -1))
		if groups == 0 {
			j.dump()
			t.Fatalf("%s started no worker group", pod)
		}
		if _, w, st := lastRestart(log); w != 3 || st != start {
			j.dump()
			t.Fatalf("%s last trained in world %d from step %d; want the replacement's 3-wide round from step %d", pod, w, st, start)
		}
		j.expect(pod+" followed the master's round", log, `the command goes on`)
		j.expect(pod+" finished", log, `\[default0\]:step = 119\n`)
		if n := strings.Count(log, "command started"); n != 1 {
			t.Errorf("%s started its command %d times, want once", pod, n)
		}
	}
	j.expect("recovered", j.view, `job-worker-0's failure is recovered`)
}

var restartRE = regexp.MustCompile(`\[default0\]:restart (\d+) rank \d+ world (\d+) start (\d+)\n`)

// lastRestart is the stand-in's last "restart R rank N world W start S"
// in a pod's log: the workers' group it trained with last.
func lastRestart(log string) (restart, world, start int) {
	m := restartRE.FindAllStringSubmatch(log, -1)
	if m == nil {
		return -1, 0, -1
	}
	last := m[len(m)-1]
	restart, _ = strconv.Atoi(last[1])
	world, _ = strconv.Atoi(last[2])
	start, _ = strconv.Atoi(last[3])
	return restart, world, start
}
