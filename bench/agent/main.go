// Command agent-bench measures the agent against torchrun on this machine,
// with the same training script (agent/testdata/train/train_steps.py):
//
//   - recovery: time from kill -9 of a worker to the first training step of
//     the restarted group (the step's own time.time(), written by the
//     script), median over -kills kills, under `kfelastic agent` (the
//     default: fork server and store proxy; with --fork-server=false; with
//     --fork-server=false --store-proxy=false; with --warm-spares) and under
//     torchrun (c10d rendezvous, --monitor_interval 1);
//   - cold start: launcher start → first step, under the agent and with the
//     two workers started bare (env set by hand), median over -starts runs;
//   - the agent's peak RSS (VmHWM), and the fork server's own memory (RSS,
//     and PSS: its share of the pages it shares with the workers).
//
// Each of it runs once per torch of -torch (default 1.13 and 2.14, the
// latter through scripts/torch2.14/python3, skipped with a note when
// `scripts/deps.sh torch2` has not built it), torchrun of the same torch
// beside the agent, and a last table puts the versions side by side.
//
// Run it with `make bench-agent`; it needs bin/kfelastic and /usr/bin/python3
// with torch (scripts/deps.sh).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kfelastic/kfelastic/internal/procmem"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// python is the interpreter of the torch being measured (runTorch).
var python string

var (
	agentBin = flag.String("agent", "bin/kfelastic", "the kfelastic binary")
	script   = flag.String("script", "agent/testdata/train/train_steps.py", "training script")
	kills    = flag.Int("kills", 6, "kill -9 per launcher")
	starts   = flag.Int("starts", 7, "cold starts per way")
	settle   = flag.Duration("settle", 4*time.Second, "training time between a restart's first step and the next kill")
	torches  = flag.String("torch", strings.Join(testenv.TorchVersions, ","), "torch versions, comma-separated (scripts/torch-python), or VERSION=PYTHON for a torch from elsewhere")
	ways     = flag.String("ways", "agent,agent-nf,agent-np,agent-ws", "the agent's ways to measure beside torchrun, comma-separated")
)

// versionResult is one torch's headline figures, for the closing table.
type versionResult struct {
	torch         string
	agent, theirs time.Duration
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	var results []versionResult
	for _, v := range strings.Split(*torches, ",") {
		tc, why := testenv.TorchNamed(v)
		if why != "" {
			fmt.Printf("bench-agent: %s: skipped\n", why)
			continue
		}
		python = tc.Python
		fmt.Printf("\n== torch %s (%s) ==\n", tc.Version, tc.Python)
		r, err := runTorch()
		if err != nil {
			return fmt.Errorf("torch %s: %w", tc.Version, err)
		}
		r.torch = tc.Version
		results = append(results, r)
	}
	fmt.Printf("\nkill -9 → first step, medians, each torch beside its own torchrun (one run, %d CPUs):\n", numCPU())
	fmt.Printf("| torch | agent (fork server) | torchrun | ratio (target ≥ 5×) |\n|---|---|---|---|\n")
	for _, r := range results {
		ratio := r.theirs.Seconds() / r.agent.Seconds()
		fmt.Printf("| %s | %v | %v | %.1f× (%s) |\n", r.torch, r.agent.Round(time.Millisecond), r.theirs.Round(time.Millisecond), ratio, verdict(ratio >= 5))
	}
	return nil
}

// runTorch measures everything with python's torch.
func runTorch() (versionResult, error) {
	for _, p := range []string{*agentBin, *script, python} {
		if _, err := os.Stat(p); err != nil {
			return versionResult{}, fmt.Errorf("%v (build with make build; install torch with scripts/deps.sh apt)", err)
		}
	}
	scriptAbs, _ := filepath.Abs(*script)
	agentAbs, _ := filepath.Abs(*agentBin)
	trainArgs := []string{scriptAbs, "--sleep", "0.05"}

	fmt.Printf("bench-agent: %d kills per launcher, %d cold starts per way, 2 workers (gloo, CPU), %d CPUs\n",
		*kills, *starts, numCPU())

	agentRun := func(flags ...string) func(mark string) *exec.Cmd {
		return func(mark string) *exec.Cmd {
			args := append([]string{"agent", "--nproc-per-node", "2", "--max-restarts", "100"}, flags...)
			args = append(append(args, "--", python), trainArgs...)
			return exec.Command(agentAbs, append(args, "--mark", mark)...)
		}
	}
	var rss int64
	var forkRSS, forkPSS int64
	var forked, plain, direct, ours []time.Duration
	for _, v := range []struct {
		name  string
		times *[]time.Duration
		flags []string
	}{{"agent", &forked, nil}, {"agent-nf", &plain, []string{"--fork-server=false"}},
		{"agent-np", &direct, []string{"--fork-server=false", "--store-proxy=false"}},
		{"agent-ws", &ours, []string{"--warm-spares"}}} {
		if v.name != "agent" && !slices.Contains(strings.Split(*ways, ","), v.name) {
			continue
		}
		r, err := recovery(v.name, agentRun(v.flags...))
		if err != nil {
			return versionResult{}, err
		}
		*v.times, rss = r.times, max(rss, r.rssKiB)
		if v.times == &forked {
			forkRSS, forkPSS = r.forkRSS, r.forkPSS
		}
	}
	r, err := recovery("torchrun", func(mark string) *exec.Cmd {
		port := freePort()
		args := []string{"-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2", "--max_restarts=100",
			"--monitor_interval=1", "--redirects", "2", "--tee", "2", "--rdzv_backend=c10d",
			"--rdzv_endpoint=127.0.0.1:" + strconv.Itoa(port), "--rdzv_id=bench"}
		c := exec.Command(python, append(append(args, trainArgs...), "--mark", mark)...)
		// torch 2.14's torchrun, restarting in place with the workers' store
		// shared in its own agent (its default), never got its restarted
		// workers to a first step here (they waited minutes); with torch's
		// own opt-out they restart as on 1.13, which ignores it.
		c.Env = append(os.Environ(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
		return c
	})
	if err != nil {
		return versionResult{}, err
	}
	theirs := r.times
	bareLaunch := func(mark string) []*exec.Cmd {
		port := strconv.Itoa(freePort())
		var cmds []*exec.Cmd
		for rank := range 2 {
			c := exec.Command(python, append(append([]string{"-u"}, trainArgs...), "--mark", mark, "--steps", "3")...)
			c.Env = append(os.Environ(), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port, "RANK="+strconv.Itoa(rank),
				"LOCAL_RANK="+strconv.Itoa(rank), "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "TORCHELASTIC_RESTART_COUNT=0",
				"OMP_NUM_THREADS=1")
			cmds = append(cmds, c)
		}
		return cmds
	}
	agentLaunch := func(mark string) []*exec.Cmd {
		args := append([]string{"agent", "--nproc-per-node", "2", "--", python}, trainArgs...)
		return []*exec.Cmd{exec.Command(agentAbs, append(args, "--mark", mark, "--steps", "3")...)}
	}
	// Interleaved, so that a change of the machine's load hits both alike.
	var bare, agentCold, bareBegin, agentBegin []time.Duration
	for i := range *starts {
		b, bb, err := coldStart(fmt.Sprintf("bare     cold start %d", i+1), bareLaunch)
		if err != nil {
			return versionResult{}, err
		}
		a, ab, err := coldStart(fmt.Sprintf("agent    cold start %d", i+1), agentLaunch)
		if err != nil {
			return versionResult{}, err
		}
		bare, agentCold = append(bare, b), append(agentCold, a)
		bareBegin, agentBegin = append(bareBegin, bb), append(agentBegin, ab)
	}

	mf, mt := median(forked), median(theirs)
	ratio := mt.Seconds() / mf.Seconds()
	fmt.Println()
	const w = 60
	fmt.Printf("%-*s %s\n", w, "kill -9 → first step, agent (fork server):", summary(forked))
	for _, r := range []struct {
		name string
		ds   []time.Duration
	}{{"--fork-server=false", plain}, {"--fork-server=false --store-proxy=false", direct}, {"--warm-spares", ours}} {
		if len(r.ds) > 0 {
			fmt.Printf("%-*s %s\n", w, "kill -9 → first step, agent "+r.name+":", summary(r.ds))
		}
	}
	fmt.Printf("%-*s %s\n", w, "kill -9 → first step, torchrun (c10d, mi=1):", summary(theirs))
	fmt.Printf("%-*s %.2fx faster (target ≥ 5x: %s)\n", w, "ratio torchrun/agent (medians):", ratio, verdict(ratio >= 5))
	for _, r := range []struct {
		name string
		ds   []time.Duration
	}{{"--fork-server=false", plain}, {"--fork-server=false --store-proxy=false", direct}, {"--warm-spares", ours}} {
		if len(r.ds) > 0 {
			fmt.Printf("%-*s %.2fx faster\n", w, "ratio torchrun/agent "+r.name+":", mt.Seconds()/median(r.ds).Seconds())
		}
	}
	if len(bare) > 0 {
		mb, ma := median(bare), median(agentCold)
		overhead := 100 * (ma.Seconds() - mb.Seconds()) / mb.Seconds()
		fmt.Printf("%-*s %s\n", w, "cold start → first step, bare workers:", summary(bare))
		fmt.Printf("%-*s %s\n", w, "cold start → first step, under the agent:", summary(agentCold))
		fmt.Printf("%-*s %+.1f%% (target < 10%%: %s)\n", w, "agent overhead over bare (medians):", overhead, verdict(overhead < 10))
		// Under the fork server the script begins once the server has imported
		// torch (the workers then skip theirs): that share is the imports'.
		fmt.Printf("%-*s bare %v, agent %v (agent's share, the fork server's imports included: %v)\n", w, "launch → script's first line (medians):",
			median(bareBegin).Round(time.Millisecond), median(agentBegin).Round(time.Millisecond),
			(median(agentBegin) - median(bareBegin)).Round(time.Millisecond))
	}
	fmt.Printf("%-*s %.1f MiB (target < 30 MiB: %s)\n", w, "agent peak RSS (VmHWM, all agent runs):", float64(rss)/1024, verdict(rss < 30*1024))
	fmt.Printf("%-*s RSS %.1f MiB, PSS %.1f MiB (one per pod)\n", w, "fork server's memory (after the kills):", float64(forkRSS)/1024, float64(forkPSS)/1024)
	return versionResult{agent: mf, theirs: mt}, nil
}

// recovered is what recovery measured: the kill → first step times, the
// launcher's peak RSS, the fork server's RSS and PSS (KiB, 0 without one).
type recovered struct {
	times                    []time.Duration
	rssKiB, forkRSS, forkPSS int64
}

// recovery starts a launcher, waits for training, then kill -9's worker 1
// of each generation and times the first step of the next one.
func recovery(name string, launcher func(mark string) *exec.Cmd) (r recovered, err error) {
	mark, _ := os.MkdirTemp("", "bench-agent-")
	defer os.RemoveAll(mark)
	cmd := launcher(mark)
	logf, _ := os.Create(filepath.Join(os.TempDir(), "bench-agent-"+name+".log"))
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return r, err
	}
	defer func() {
		// torch 2.x's torchrun starts each worker in a session of its own,
		// out of the launcher's process group: its children too.
		for _, w := range testenv.ChildrenOf(cmd.Process.Pid) {
			_ = syscall.Kill(w, syscall.SIGKILL)
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*kills+2)*120*time.Second)
	defer cancel()
	if _, err := firstStep(ctx, mark, 0); err != nil {
		return r, fmt.Errorf("%s: %w (log: %s)", name, err, logf.Name())
	}
	for gen := range *kills {
		time.Sleep(*settle)
		pid, err := readInt(filepath.Join(mark, fmt.Sprintf("pid-%d-1", gen)))
		if err != nil {
			return r, fmt.Errorf("%s: %w", name, err)
		}
		killed := time.Now()
		if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
			return r, fmt.Errorf("%s: kill %d: %w", name, pid, err)
		}
		step, err := firstStep(ctx, mark, gen+1)
		if err != nil {
			return r, fmt.Errorf("%s: restart %d: %w (log: %s)", name, gen+1, err, logf.Name())
		}
		d := step.Sub(killed)
		r.times = append(r.times, d)
		fmt.Printf("%-8s kill %d: %v\n", name, gen+1, d.Round(time.Millisecond))
	}
	r.rssKiB = vmHWM(cmd.Process.Pid)
	if data, err := os.ReadFile(logf.Name()); err == nil {
		if m := forkServerPid.FindAllSubmatch(data, -1); m != nil {
			pid, _ := strconv.Atoi(string(m[len(m)-1][1]))
			r.forkRSS, r.forkPSS, _ = procmem.Rollup(pid)
		}
	}
	return r, nil
}

// forkServerPid finds the fork server in the agent's log.
var forkServerPid = regexp.MustCompile(`msg="fork server starting" pid=(\d+)`)

// coldStart times launch → first step once, and launch → the script's
// first line (the launcher's own share, without the imports).
func coldStart(name string, launch func(mark string) []*exec.Cmd) (toStep, toScript time.Duration, err error) {
	mark, _ := os.MkdirTemp("", "bench-agent-")
	defer os.RemoveAll(mark)
	cmds := launch(mark)
	start := time.Now()
	for _, c := range cmds {
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := c.Start(); err != nil {
			return 0, 0, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	step, err := firstStep(ctx, mark, 0)
	begin, _ := earliestMark(mark, "begin-0-*")
	cancel()
	for _, c := range cmds {
		_ = c.Wait()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", name, err)
	}
	toStep, toScript = step.Sub(start), begin.Sub(start)
	fmt.Printf("%s: %v (script began after %v)\n", name, toStep.Round(time.Millisecond), toScript.Round(time.Millisecond))
	return toStep, toScript, nil
}

// firstStep waits for the step-<gen>-* marks and returns the earliest: one
// step is an all-reduce, so any rank's first step is the group's.
func firstStep(ctx context.Context, dir string, gen int) (time.Time, error) {
	for {
		if first, ok := earliestMark(dir, fmt.Sprintf("step-%d-*", gen)); ok {
			return first, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("no first step of generation %d: %w", gen, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// earliestMark is the earliest time.time() written in the marks matching
// pattern.
func earliestMark(dir, pattern string) (time.Time, bool) {
	matches, _ := filepath.Glob(filepath.Join(dir, pattern))
	var first time.Time
	for _, m := range matches {
		data, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		sec, err := strconv.ParseFloat(strings.TrimSpace(string(data)), 64)
		if err != nil {
			continue
		}
		t := time.Unix(0, int64(sec*1e9))
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	return first, !first.IsZero()
}

func readInt(path string) (int64, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(path)
		if err == nil {
			return strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		}
		if time.Now().After(deadline) {
			return 0, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func vmHWM(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return -1
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func summary(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("median %v (min %v, max %v, n=%d)", median(ds).Round(time.Millisecond),
		s[0].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func numCPU() int {
	data, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(data), "processor\t:")
}
