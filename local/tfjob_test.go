package local

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

func TestTFNames(t *testing.T) {
	tf := TF{PS: 2, Workers: 2}
	want := []string{"j-chief-0", "j-ps-0", "j-ps-1", "j-worker-0", "j-worker-1"}
	for r, name := range want {
		if got := tf.PodName("j", r); got != name {
			t.Errorf("rank %d: %s, want %s", r, got, name)
		}
		typ, i := tf.Task(r)
		if tf.Rank(typ, i) != r {
			t.Errorf("rank %d: Task %s/%d maps back to %d", r, typ, i, tf.Rank(typ, i))
		}
	}
	if tf.Replicas() != 5 {
		t.Errorf("replicas %d, want 5", tf.Replicas())
	}
}

// TF_CONFIG as the training operator writes it: every replica's address by
// type, in index order, and the pod's own task.
func TestTFConfig(t *testing.T) {
	tf := TF{PS: 2, Workers: 1}
	addrs := []string{"c:1", "p0:2", "p1:3", "w0:4"}
	s, err := tf.TFConfig(2, addrs)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Cluster map[string][]string
		Task    struct {
			Type  string
			Index int
		}
		Environment string
	}
	if err := json.Unmarshal([]byte(s), &cfg); err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.Cluster["chief"], ",") != "c:1" || strings.Join(cfg.Cluster["ps"], ",") != "p0:2,p1:3" ||
		strings.Join(cfg.Cluster["worker"], ",") != "w0:4" || cfg.Task.Type != "ps" || cfg.Task.Index != 1 || cfg.Environment != "cloud" {
		t.Errorf("TF_CONFIG %s", s)
	}
}

// A TF replica's pod is recreated under its own name and index, with the
// memory it is given; all replicas run at once.
func TestTFBook(t *testing.T) {
	b := NewTFBook("j", TF{PS: 1, Workers: 1}, 100)
	if got := len(b.Schedule()); got != 3 {
		t.Fatalf("%d pods started, want every replica (3)", got)
	}
	if b.Relaunch(1, 500).Memory != 100 {
		t.Errorf("a relaunch of a running pod changed it")
	}
	b.Exited("j-ps-0")
	p := b.Relaunch(1, 200)
	if p.Name != "j-ps-0" || p.Index != 0 || p.Rank != 1 || p.Memory != 200 || p.State != Pending || p.Replaces != "j-ps-0" {
		t.Errorf("relaunch: %+v", *p)
	}
	if s := b.Schedule(); len(s) != 1 || s[0].Name != "j-ps-0" {
		t.Errorf("scheduled %v, want the relaunched ps", s)
	}
	if b.Done() {
		t.Errorf("done with pods running")
	}
	for _, n := range []string{"j-chief-0", "j-ps-0", "j-worker-0"} {
		b.Exited(n)
	}
	if !b.Done() || len(b.Pods()) != 3 {
		t.Errorf("done %v, pods %v", b.Done(), b.Pods())
	}
}

// runTF runs the TF PS stand-in (examples/tfps/ps_standin.py: TensorFlow
// cannot be installed here, so a Python program that reads TF_CONFIG and
// behaves as a PS job, parameter servers over TCP, plays TensorFlow) as a
// TF job of one chief, tf.PS parameter servers and tf.Workers workers,
// each pod under a real kfelastic agent, with real signals and cgroups.
func runTF(t *testing.T, tf TF, opts Options, steps int, chaos ...string) *job {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "examples", "tfps", "ps_standin.py")
	opts.TF = &tf
	opts.Command = []string{python, script, "--steps", strconv.Itoa(steps), "--sleep", "0.1", "--ckpt-every", "10",
		"--ckpt-dir", filepath.Join(t.TempDir(), "ckpt")}
	return runJob(t, opts, steps, chaos...)
}

// tfStepsAfter checks that pod trained on past step from after the line
// matching after in its log.
func (j *job) tfStepsAfter(pod, after string, from int) {
	j.t.Helper()
	log := j.podLog(pod)
	i := strings.Index(log, after)
	if i < 0 {
		j.dump()
		j.t.Fatalf("%s: no %q", pod, after)
	}
	j.expect(pod+" trained on", log[i:], `step = (`+strconv.Itoa(from+1)+`|`+strconv.Itoa(from+2)+`|`+strconv.Itoa(from+3)+`)\b`)
}

// deleteReplica runs a TF job of 120 steps whose replica typ/index is
// deleted at step, and checks that the job succeeded and that the pod was
// recreated under its own name, its relaunch not counted, and started twice.
func deleteReplica(t *testing.T, tf TF, typ string, index, step int) *job {
	t.Helper()
	r := tf.Rank(typ, index)
	pod := tf.PodName("job", r)
	j := runTF(t, tf, Options{}, 120, "delete-pod:"+strconv.Itoa(r)+"@step="+strconv.Itoa(step))
	j.succeeded()
	j.expect("deletion", j.view, `delete-pod: SIGTERM to `+pod)
	j.expect("recreated", j.view, pod+` replaces `+pod+` as rank `+strconv.Itoa(r)+` after Preempted \(relaunch, not counted\)`)
	if n := strings.Count(j.podLog(pod), "TF_CONFIG cluster"); n != 2 {
		j.dump()
		t.Fatalf("%s started %d times, want 2", pod, n)
	}
	return j
}

// Scenario 8: a TF PS job's worker pod is deleted: the operator recreates it
// under the same name (job-worker-1), it rejoins the cluster by TF_CONFIG,
// and training continues to the end.
func TestScenario8TFWorkerDeleted(t *testing.T) {
	j := deleteReplica(t, TF{PS: 1, Workers: 2}, "worker", 1, 15)
	log := j.podLog("job-worker-1")
	second := log[strings.LastIndex(log, "TF_CONFIG cluster"):]
	j.expect("the new worker trained", second, `loss = [\d.]+, step = \d+`)
	j.expect("to the end", j.podLog("job-chief-0"), `global step 1[2-9]\d reached 120: done`)
}

// Scenario 9: a TF PS job's chief is OOM-killed (a process in its memory
// cgroup allocates past the limit; the kernel kills it and the pod with it):
// it is recreated with twice the memory, which the new chief reads from its
// own cgroup, and restores the session from its checkpoint.
func TestScenario9TFChiefOOM(t *testing.T) {
	tf := TF{PS: 1, Workers: 2}
	const mem = 256 << 20
	j := runTF(t, tf, Options{Memory: mem}, 150, "oom:0@step=20")
	j.succeeded()
	if !strings.Contains(j.view, "memory and CPU limits: cgroup") {
		t.Skip("no memory cgroup here (rlimit mode): an allocation fails instead of an OOM kill")
	}
	j.expect("recreated with twice the memory", j.view, `job-chief-0 replaces job-chief-0 as rank 0 after OOMKilled \(relaunch-more-memory, counted, memory 256 MiB → 512 MiB`)
	log := j.podLog("job-chief-0")
	limits := regexpAll(log, `memory limit = (\d+)`)
	if len(limits) != 2 || limits[0] != strconv.Itoa(mem) || limits[1] != strconv.Itoa(2*mem) {
		j.dump()
		t.Fatalf("the chief's memory limits as it read them from its cgroup: %v, want %d then %d", limits, mem, 2*mem)
	}
	second := log[strings.LastIndex(log, "TF_CONFIG cluster"):]
	m := j.expect("restored", second, `restored from checkpoint at step ([1-9]\d*)`)
	from, _ := strconv.Atoi(m[1])
	t.Logf("the chief ran under %v bytes, then %v; the recreated one restored step %d", limits[0], limits[1], from)
	j.tfStepsAfter("job-chief-0", m[0], from)
	// The OOMKilled document (the engine writes it: the agent died with
	// the pod) is moved aside once the recreated chief runs (by its agent,
	// which supersedes its own pod's documents as after any restart).
	if docs, _ := filepath.Glob(filepath.Join(j.out, "errors", "superseded", "error-*job-chief-0*.pb")); len(docs) != 1 || j.res.Message != "" {
		t.Errorf("superseded documents %v, root cause %q: want the OOMKilled one aside and none", docs, j.res.Message)
	}
}

// Scenario 10: a TF PS job's parameter server is deleted: it is recreated
// with the same name and index (job-ps-0, on its address), empty; the chief
// sees the new incarnation and restores every ps from its checkpoint, and
// training resumes from that step.
func TestScenario10TFPSDeleted(t *testing.T) {
	j := deleteReplica(t, TF{PS: 2, Workers: 1}, "ps", 0, 25)
	chief := j.podLog("job-chief-0")
	j.expect("the chief saw the restart", chief, `a ps restarted`)
	m := j.expect("restored", chief, `a ps restarted[^\n]*\n(?:.*\n)*?.*restored from checkpoint at step ([1-9]\d*)`)
	from, _ := strconv.Atoi(m[1])
	if from < 10 || !strings.Contains(chief, "checkpoint saved at step "+m[1]+"\n") {
		t.Errorf("restored step %d: want a checkpoint the chief saved (every 10 steps) before the deletion at step 25", from)
	}
	t.Logf("after job-ps-0's deletion at step 25 or later, the chief restored step %d", from)
	j.tfStepsAfter("job-chief-0", "restored from checkpoint at step "+m[1], from)
}

func regexpAll(s, pattern string) []string {
	var out []string
	for _, m := range regexp.MustCompile(pattern).FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}
