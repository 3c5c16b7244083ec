// Command preload measures what the torch hook (agent/torchhook, DESIGN
// §4.7) does for a container with a CPU limit: a flytekit-style command
// (torch's elastic_launch, start method spawn, two workers, one of which
// fails once) started as torch runs it (the anchor: each worker a new
// interpreter) and under the real hook (the workers forked from a fork of
// the command made once it imported torch). It prints the time from the
// command's start to its first worker's first line, and from the failure to
// a restarted worker's first line. Each run is a fresh cgroup with a CFS
// quota of the given CPUs, as the kubelet sets from limits.cpu. It runs the
// real torches (scripts/torch-python), one run at a time.
//
//	go run ./bench/preload [-cpus 0.1,0.25,0.5,1,0] [-runs 3] [-torch 1.13,2.14]
//
// Needs root (a writable cgroup file system).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kfelastic/kfelastic/agent/torchhook"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/local"
)

// command is the flytekit-style command: torch imported at its top, then
// torch elastic's elastic_launch of two workers with spawn, as flytekit's
// Elastic task does; worker 0 fails in the first attempt and torch
// restarts the group. Each worker prints when it runs ("first"/"restart"
// and the time), the failing one when it fails.
const command = `import os, sys, time
import torch
from torch.distributed.launcher.api import LaunchConfig, elastic_launch


def worker():
    now = time.time()
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        print("first %.6f" % now, flush=True)
        if os.environ["LOCAL_RANK"] == "0":
            print("failed %.6f" % time.time(), flush=True)
            sys.exit(1)
        time.sleep(120)  # until torch stops the group
    else:
        print("restart %.6f" % now, flush=True)


if __name__ == "__main__":
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="preload", rdzv_backend="c10d",
                       rdzv_endpoint="127.0.0.1:" + sys.argv[1], max_restarts=1, monitor_interval=0.1,
                       start_method="spawn")
    elastic_launch(cfg, worker)()
`

func main() {
	cpusFlag := flag.String("cpus", "0.1,0.25,0.5,1,0", "CPU limits to measure, comma-separated (0: none)")
	runs := flag.Int("runs", 3, "runs per way and limit (the median is shown)")
	torches := flag.String("torch", strings.Join(testenv.TorchVersions, ","), "torch versions (scripts/torch-python)")
	flag.Parse()
	if err := run(*cpusFlag, *runs, *torches); err != nil {
		fmt.Fprintln(os.Stderr, "preload:", err)
		os.Exit(1)
	}
}

func run(cpusFlag string, runs int, torches string) error {
	var limits []float64
	for _, f := range strings.Split(cpusFlag, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 {
			return fmt.Errorf("-cpus: %q is not a CPU count", f)
		}
		limits = append(limits, v)
	}
	lim := local.NewLimits(fmt.Sprintf("kfelastic-preload-%d", os.Getpid()))
	defer lim.Remove()
	if lim.Mode == "rlimit" {
		return fmt.Errorf("no writable cgroup here (run as root): a CPU limit cannot be set")
	}
	dir, err := os.MkdirTemp("", "kfelastic-preload")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "command.py")
	if err := os.WriteFile(script, []byte(command), 0o644); err != nil {
		return err
	}
	hook, err := torchhook.Install(dir)
	if err != nil {
		return err
	}
	fmt.Printf("the torch hook under a CPU limit (%s; median of %d runs, seconds: the first worker's first line after the\n"+
		"command's start, and a restarted worker's after the failure; spawn is torch without the hook, the anchor)\n", lim.Mode, runs)
	fmt.Printf("%-6s %-6s %9s %9s %7s %13s %9s %7s\n", "torch", "CPUs", "1st spawn", "1st hook", "ratio", "restart spawn", "hook", "ratio")
	n := 0
	for _, tv := range strings.Split(torches, ",") {
		tc, why := testenv.TorchNamed(strings.TrimSpace(tv))
		if why != "" {
			fmt.Printf("%-6s skipped: %s\n", tv, why)
			continue
		}
		py := tc.Python
		for _, cpus := range limits {
			var first, restart [2][]float64 // spawn, hook
			for i := range runs {
				for w, way := range []string{"spawn", "hook"} {
					n++
					cg, err := lim.Pod(fmt.Sprintf("run-%d", n), 0)
					if err != nil {
						return err
					}
					if cpus > 0 && !cg.Throttle(cpus) {
						return fmt.Errorf("cannot set a CPU limit in %s", lim.Mode)
					}
					s, err := once(py, script, way, hook, cg)
					cg.Remove()
					if err != nil {
						return fmt.Errorf("torch %s, %g CPUs, %s, run %d: %w", tv, cpus, way, i+1, err)
					}
					first[w], restart[w] = append(first[w], s[0]), append(restart[w], s[1])
				}
			}
			label := strconv.FormatFloat(cpus, 'g', -1, 64)
			if cpus == 0 {
				label = "none"
			}
			fmt.Printf("%-6s %-6s %9.2f %9.2f %6.2f× %13.2f %9.2f %6.2f×\n", tv, label,
				median(first[0]), median(first[1]), median(first[1])/median(first[0]),
				median(restart[0]), median(restart[1]), median(restart[1])/median(restart[0]))
		}
	}
	return nil
}

// once runs the command in the cgroup, with the torch hook (way "hook")
// or without, and returns the seconds to its first worker's first line
// (since the command's start) and to a restarted worker's (since the
// failure).
func once(py, script, way, hook string, cg *local.Cgroup) ([2]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	port, err := testenv.FreePortNumber()
	if err != nil {
		return [2]float64{}, err
	}
	join := `for f in $CGROUP_PROCS; do echo $$ > "$f" || exit 111; done; exec "$@"`
	start := time.Now()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", join, "sh", py, script, strconv.Itoa(port))
	env := map[string]string{}
	if way == "hook" {
		// As the agent sets it for a --launcher command (the relay's
		// poll aside: no master here).
		torchhook.Env(env, hook, torchhook.Options{Preload: "torch", DrainErrors: true})
	}
	cmd.Env = append(os.Environ(), "CGROUP_PROCS="+strings.Join(cg.ProcsFiles(), " "))
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// The run's processes die with this one, and with its timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.StdoutPipe()
	if err != nil {
		return [2]float64{}, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return [2]float64{}, err
	}
	at := map[string]float64{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		what, v, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if t, err := strconv.ParseFloat(v, 64); err == nil {
			if _, seen := at[what]; !seen {
				at[what] = t
			}
		}
	}
	werr := cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // a worker left behind
	first, failed, restart := at["first"], at["failed"], at["restart"]
	if werr != nil || first == 0 || failed == 0 || restart == 0 {
		return [2]float64{}, fmt.Errorf("%v: %s", werr, lastLines(stderr.String(), 5))
	}
	return [2]float64{first - float64(start.UnixNano())/1e9, restart - failed}, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
