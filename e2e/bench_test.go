package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestBenchPodDeletedBesideUpstream is `make bench-e2e`: E3's and E4's
// faults (worker 1's, then worker 0's pod deleted under a flytekit-style
// elastic task) through a real flytepropeller, each once with
// kfelastic-pytorch and once, in another namespace of the same cluster in
// the same run, with flyteplugins' own PyTorch plugin (same version, linked
// into the same propeller) and plain torch elastic, whose c10d store lives
// in worker 0's pod. Every job runs the same task template, one after the
// other. It prints fault → first training step after recovery, or what the
// workflow came to instead. A figure, not a timed assertion: it runs only
// with KFELASTIC_BENCH_E2E=1.
func TestBenchPodDeletedBesideUpstream(t *testing.T) {
	if os.Getenv("KFELASTIC_BENCH_E2E") == "" {
		t.Skip("a benchmark: make bench-e2e")
	}
	base := newEnv(t, "bench")
	// Four jobs one after the other: not one scenario's budget.
	base.deadline = time.Now().Add(40 * time.Minute)
	var rows []string
	for _, fault := range []struct{ name, victim, survivor string }{
		{"E3 worker 1's pod deleted", "worker-1", "worker-0"},
		{"E4 worker 0's pod deleted", "worker-0", "worker-1"},
	} {
		for _, side := range []struct{ name, plugin string }{{"kfelastic-pytorch", ""}, {"upstream pytorch", "pytorch"}} {
			ns := fmt.Sprintf("b%s-%s", strings.Fields(fault.name)[0][1:], strings.Fields(side.name)[0])
			e := base.inNamespace(ns, side.plugin)
			launched := time.Now()
			rows = append(rows, fmt.Sprintf("%-26s %-18s %s", fault.name, side.name,
				benchPodDeleted(e, e.launchWorkflow(ns, e.template("flytekit-2-3", nil)), launched, fault.victim, fault.survivor)))
		}
	}
	t.Logf("fault → first training step of a surviving worker after it (one run, one after the other):\n%s\n"+
		"DLRover's reference: about 2 minutes to a replacement pod on Kubernetes.", strings.Join(rows, "\n"))
}

// restartRE is the stand-in's line once a worker's process group is up
// (not torch's "will restart worker group").
var restartRE = regexp.MustCompile(`restart \d+ rank \d+`)

// benchPodDeleted deletes the job's victim pod once the survivor trains and
// says how long until the survivor's workers trained again: the stand-in
// prints "restart R rank N …" once a new process group is up, and steps
// already in flight at the fault do not count.
func benchPodDeleted(e *env, j *job, launched time.Time, victim, survivor string) string {
	victim, survivor = j.name+"-"+victim, j.name+"-"+survivor
	// E1: the workflow created → its first training step (seen within the
	// 0.2 s the log is polled).
	first := j.waitStep(survivor, 1, 5*time.Minute).Sub(launched)
	j.waitStep(survivor, 20, 5*time.Minute)
	restarts := len(restartRE.FindAllStringIndex(j.logs(survivor), -1))
	recovered := func() bool {
		log := j.logs(survivor)
		starts := restartRE.FindAllStringIndex(log, -1)
		return len(starts) > restarts && strings.Contains(log[starts[len(starts)-1][0]:], "step = ")
	}
	fault := j.deletePod(j.pod(victim))
	for deadline := time.Now().Add(4 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if recovered() {
			took := time.Since(fault)
			keepBenchLogs(j, fault, victim, survivor)
			phases := "\n    replacement: " + recoveryPhases(j.logs(victim), fault, j.podOrNil(victim)) +
				"\n    survivor:    " + recoveryPhases(j.logs(survivor), fault, nil)
			return fmt.Sprintf("E1 created → first step %5.1fs; first step after recovery %6.1fs, then %s%s", first.Seconds(), took.Seconds(),
				j.outcome(6*time.Minute).Phase, phases)
		}
		if o := j.outcomeNow(); o.Terminal() {
			return fmt.Sprintf("E1 created → first step %5.1fs; no recovery: %s after %.1fs (%s)", first.Seconds(), o.Phase,
				time.Since(fault).Seconds(), tail(o.String(), 300))
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("no step and not terminal after %v: %s", 4*time.Minute, j.outcomeNow())
		}
	}
}

// keepBenchLogs writes the survivor's and the replacement's logs to
// $KFELASTIC_BENCH_E2E_LOGS/<job>-<pod>.log, headed by the fault's time,
// when that variable names a folder: where a recovery's time went.
func keepBenchLogs(j *job, fault time.Time, pods ...string) {
	dir := os.Getenv("KFELASTIC_BENCH_E2E_LOGS")
	if dir == "" {
		return
	}
	for _, pod := range pods {
		head := "fault at " + fault.UTC().Format(time.RFC3339Nano) + "\n"
		if p := j.podOrNil(pod); p != nil {
			head += "pod created " + p.CreationTimestamp.UTC().Format(time.RFC3339) + "\n"
		}
		if err := os.WriteFile(fmt.Sprintf("%s/%s.log", dir, pod), []byte(head+j.logs(pod)), 0o644); err != nil {
			j.e.t.Log(err)
		}
	}
}

// recoveryMilestones are the log lines that mark a pod's way back to
// training after a fault, in the order they come: the agent's, the
// stand-in's (LOGLEVEL=INFO) and torch's elastic agent's.
var recoveryMilestones = []struct{ name, text string }{
	{"agent", `msg="agent starting"`},
	{"command", `msg="command started"`},
	{"python", "command started, importing torch"},
	{"torch imported", "command imported torch"},
	{"rendezvous", "Rendezvous'ing worker group"},
	{"rendezvous complete", "Rendezvous complete for workers"},
	{"worker imported", "worker imported, entrypoint called"},
	{"process group", "process group ready"},
}

// logTimeRE finds a line's time as the agent (time=…Z), the stand-in
// (ISO, the pod's UTC) and torch's loggers (asctime, a comma before the
// milliseconds) print it.
var logTimeRE = regexp.MustCompile(`(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)[.,](\d+)`)

// recoveryPhases says when each milestone first came after the fault, in
// seconds from it (the replacement pod's creation too, when pod is given):
// where a recovery's time went.
func recoveryPhases(log string, fault time.Time, pod *corev1.Pod) string {
	var b strings.Builder
	if pod != nil {
		fmt.Fprintf(&b, "created +%.0fs", pod.CreationTimestamp.Sub(fault).Seconds())
	}
	next := 0
	for line := range strings.SplitSeq(log, "\n") {
		if next == len(recoveryMilestones) {
			break
		}
		m := logTimeRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse("2006-01-02T15:04:05.999999999", strings.Replace(m[1], " ", "T", 1)+"."+m[2])
		if err != nil || at.Before(fault) {
			continue
		}
		for i := next; i < len(recoveryMilestones); i++ {
			if strings.Contains(line, recoveryMilestones[i].text) {
				if b.Len() > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "%s +%.1fs", recoveryMilestones[i].name, at.Sub(fault).Seconds())
				next = i + 1
				break
			}
		}
	}
	return b.String()
}
