// Command preload measures what the torch hook's forkserver preload costs
// a container with a CPU limit (agent/cpulimit.go, DESIGN §4.7): the time
// from a flytekit-style command's start to its first worker's first line,
// with the workers spawned as torch elastic does without the hook, and
// forked from a forkserver that imports torch (and torch._dynamo where the
// torch has it) beside the command's own start, as the hook has it. Each
// run is a fresh cgroup with a CFS quota of the given CPUs, as the kubelet
// sets from limits.cpu. It runs the real torches (scripts/torch-python),
// one run at a time, and prints the hook's time over the spawn's.
//
//	go run ./bench/preload [-cpus 0.1,0.25,0.5,1,0] [-runs 3] [-torch 1.13,2.14]
//
// Needs root (a writable cgroup file system); the anchor is the same
// command without the hook, in the same cgroup.
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

	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/local"
)

// command is the flytekit-style command: torch imported in the command's
// interpreter, then a worker started with multiprocessing (torch elastic's
// MultiprocessContext), which imports the script again and says when it
// runs, then once it ended another (a restart). "hook" starts the
// preloading forkserver first, as the hook's sitecustomize does before the
// command's imports.
const command = `import sys, time
t0 = float(sys.argv[2])
if __name__ == "__main__":
    import multiprocessing as mp
    if sys.argv[1] == "hook":
        import importlib.util
        pre = ["torch"] + (["torch._dynamo"] if importlib.util.find_spec("torch._dynamo") else [])
        mp.set_forkserver_preload(pre)
        from multiprocessing import forkserver
        forkserver.ensure_running()
        ctx = mp.get_context("forkserver")
    else:
        ctx = mp.get_context("spawn")
import torch

def worker(what, t0):
    print("%s %.3f" % (what, time.time() - t0), flush=True)

if __name__ == "__main__":
    for what in ("first", "restart"):
        p = ctx.Process(target=worker, args=(what, t0))
        p.start()
        p.join()
        if p.exitcode:
            sys.exit(p.exitcode)
        t0 = time.time()
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
	fmt.Printf("the torch hook's preload under a CPU limit (%s; median of %d runs, seconds: the first worker's first line after the\n"+
		"command's start, and a restarted worker's after the first ended; spawn is torch without the hook, the anchor)\n", lim.Mode, runs)
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
					s, err := once(py, script, way, cg)
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

// once runs the command in the cgroup and returns the seconds its first
// worker printed (since the command's start) and its restart (since the
// first ended).
func once(py, script, way string, cg *local.Cgroup) ([2]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	join := `for f in $CGROUP_PROCS; do echo $$ > "$f" || exit 111; done; exec "$@"`
	t0 := float64(time.Now().UnixNano()) / 1e9
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", join, "sh", py, script, way, strconv.FormatFloat(t0, 'f', 6, 64))
	cmd.Env = append(os.Environ(), "CGROUP_PROCS="+strings.Join(cg.ProcsFiles(), " "))
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
	secs := [2]float64{-1, -1}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		what, v, _ := strings.Cut(sc.Text(), " ")
		if i := slices.Index([]string{"first", "restart"}, what); i >= 0 {
			secs[i], _ = strconv.ParseFloat(v, 64)
		}
	}
	if err := cmd.Wait(); err != nil || secs[0] < 0 || secs[1] < 0 {
		return secs, fmt.Errorf("%v: %s", err, lastLines(stderr.String(), 5))
	}
	return secs, nil
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
