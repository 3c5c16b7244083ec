package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestBenchWorker0DeletedBesideUpstream is `make bench-e2e`: E4's fault
// (worker 0's pod deleted under a flytekit-style elastic task) through a
// real flytepropeller, once with kfelastic-pytorch and once, in another
// namespace of the same cluster in the same run, with flyteplugins' own
// PyTorch plugin (same version, linked into the same propeller) and plain
// torch elastic, whose c10d store lives in worker 0's pod. It prints
// fault → first training step after recovery for each, or what upstream's
// workflow came to instead. A figure, not a timed assertion: it runs only
// with KFELASTIC_BENCH_E2E=1.
func TestBenchWorker0DeletedBesideUpstream(t *testing.T) {
	if os.Getenv("KFELASTIC_BENCH_E2E") == "" {
		t.Skip("a benchmark: make bench-e2e")
	}
	base := newEnv(t, "b4")
	var rows []string
	for _, side := range []struct{ name, plugin string }{{"kfelastic-pytorch", ""}, {"upstream pytorch", "pytorch"}} {
		e := base.inNamespace("b4-"+strings.Fields(side.name)[0], side.plugin)
		j := e.launchWorkflow("b4", e.template("flytekit-2-3", nil))
		w0, w1 := j.name+"-worker-0", j.name+"-worker-1"
		j.waitStep(w1, 20, 5*time.Minute)
		victim := j.pod(w0)
		// Recovered: worker 1's torch started its workers again (the
		// stand-in prints "restart R rank N …" once their process group is
		// up) and they trained a step; steps already in flight at the fault
		// do not count.
		restarts := strings.Count(j.logs(w1), "restart ")
		recovered := func() bool {
			log := j.logs(w1)
			return strings.Count(log, "restart ") > restarts && strings.Contains(log[strings.LastIndex(log, "restart "):], "step = ")
		}
		fault := j.deletePod(victim)
		row := fmt.Sprintf("%-18s", side.name)
		for deadline := time.Now().Add(4 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if recovered() {
				row += fmt.Sprintf("  first step after recovery %6.1fs", time.Since(fault).Seconds())
				o := j.outcome(6 * time.Minute)
				row += fmt.Sprintf(", then %s", o.Phase)
				break
			}
			if o := j.outcomeNow(); o.Terminal() {
				row += fmt.Sprintf("  no recovery: %s after %.1fs (%s)", o.Phase, time.Since(fault).Seconds(), tail(o.String(), 300))
				break
			}
			if time.Now().After(deadline) {
				row += fmt.Sprintf("  no step and not terminal after %v: %s", 4*time.Minute, j.outcomeNow())
				break
			}
		}
		rows = append(rows, row)
	}
	t.Logf("E4's fault, worker 0's pod deleted (fault → first training step of worker 1 after it):\n%s\n"+
		"DLRover's reference: about 2 minutes to a replacement pod on Kubernetes.", strings.Join(rows, "\n"))
}
