// Command recovery is make bench-recovery: the time from a fault to the first
// training step after recovery, median over -runs runs, for the scenarios of
// DESIGN.md §8 that kfelastic local injects, on the bundled example
// (examples/train/train.py, gloo, one worker per pod):
//
//   - 1: a pod is deleted (SIGTERM, a preemption): the master relaunches its
//     rank as a new pod, the others re-rendezvous with it (--nnodes 2:2);
//   - 5: kill -9 of a worker: its agent restarts the group in place
//     (--nnodes 2:2);
//   - 7: a pod fails for good (its machine, and its replacement's): training
//     goes on with 3 of 4 pods (--nnodes 3:4).
//
// Beside them, torchrun (torch 1.13, c10d rendezvous, --monitor_interval 1)
// with the same script where it can express the fault: 5 (kill -9 of node
// 1's worker), and 1 (node 1's torchrun gets SIGTERM and a new one starts at
// once, as the training operator recreates the pod), with the ratio; and
// DLRover's reported ≈2 min to a replacement pod on Kubernetes as the
// reference row of scenario 1. Scenario 11 (worker-0 under --launcher
// command) has its place here once the local engine runs it.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kfelastic/kfelastic/local"
)

const python = "/usr/bin/python3"

var (
	bin    = flag.String("bin", "bin/kfelastic", "the kfelastic binary the pods run")
	script = flag.String("script", "examples/train/train.py", "the training script")
	runs   = flag.Int("runs", 3, "runs per row")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-recovery:", err)
		os.Exit(1)
	}
}

type row struct {
	name   string
	ours   func(i int) (time.Duration, error)
	theirs func(i int) (time.Duration, error)
	ref    string
}

func run() error {
	binAbs, _ := filepath.Abs(*bin)
	scriptAbs, _ := filepath.Abs(*script)
	for _, p := range []string{binAbs, scriptAbs, python} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%v (make build; scripts/deps.sh torch)", err)
		}
	}
	ours := func(min, max int, chaos string) func(int) (time.Duration, error) {
		return func(int) (time.Duration, error) { return localRun(binAbs, scriptAbs, min, max, chaos) }
	}
	rows := []row{
		{name: "1 delete-pod (preemption) → replacement trains", ours: ours(2, 2, "delete-pod:1@step=10"),
			theirs: func(int) (time.Duration, error) { return torchrunRun(scriptAbs, "replace-node") },
			ref:    "DLRover on Kubernetes: ≈2 min to a replacement pod"},
		{name: "5 kill -9 of a worker → group restarted", ours: ours(2, 2, "kill-worker:1/0@step=10"),
			theirs: func(int) (time.Duration, error) { return torchrunRun(scriptAbs, "kill-worker") }},
		{name: "7 a pod fails for good → training with 3 of 4", ours: ours(3, 4, "fail-pod:3@step=10")},
	}
	fmt.Printf("fault → first training step after recovery, median of %d runs (this machine: %d cores)\n\n", *runs, numCPU())
	fmt.Printf("%-50s %-28s %-28s %s\n", "scenario", "kfelastic local", "torchrun c10d", "ratio")
	for _, r := range rows {
		o := measure(r.ours)
		line := fmt.Sprintf("%-50s %-28s", r.name, o.String())
		if r.theirs != nil {
			t := measure(r.theirs)
			ratio := "—"
			if o.ok() && t.ok() {
				ratio = fmt.Sprintf("%.1fx", t.median().Seconds()/o.median().Seconds())
			}
			line += fmt.Sprintf(" %-28s %s", t.String(), ratio)
		} else {
			line += fmt.Sprintf(" %-28s %s", "(cannot express it)", "—")
		}
		fmt.Println(line)
		if r.ref != "" {
			fmt.Printf("%-50s %s\n", "  reference", r.ref)
		}
	}
	return nil
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

type sample struct {
	ds   []time.Duration
	errs []string
}

func measure(f func(int) (time.Duration, error)) sample {
	var s sample
	for i := range *runs {
		d, err := f(i)
		if err != nil {
			s.errs = append(s.errs, err.Error())
			fmt.Fprintf(os.Stderr, "  run %d: %v\n", i, err)
			continue
		}
		s.ds = append(s.ds, d)
	}
	return s
}

func (s sample) ok() bool { return len(s.ds) > 0 }

func (s sample) median() time.Duration {
	ds := slices.Clone(s.ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func (s sample) String() string {
	if !s.ok() {
		return fmt.Sprintf("failed (%d)", len(s.errs))
	}
	return fmt.Sprintf("%.2fs (%.2f–%.2f, n=%d)", s.median().Seconds(), slices.Min(s.ds).Seconds(), slices.Max(s.ds).Seconds(), len(s.ds))
}

// localRun runs one job under the engine and returns its recovery time.
func localRun(binAbs, scriptAbs string, min, max int, spec string) (time.Duration, error) {
	c, err := local.ParseChaos(spec)
	if err != nil {
		return 0, err
	}
	out, err := os.MkdirTemp("", "bench-recovery")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(out)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := local.Run(ctx, local.Options{Job: "bench", MinNodes: min, MaxNodes: max, NProcPerNode: 1, MaxRestarts: 2,
		MaxRelaunches: 1, Out: out, Binary: binAbs, Chaos: []local.Chaos{c}, Grace: 3 * time.Second, Network: "host",
		Command: []string{python, scriptAbs, "--steps", "40", "--sleep", "0.05", "--ckpt-every", "5", "--ckpt-dir", filepath.Join(out, "ckpt")}})
	if err != nil {
		return 0, err
	}
	if len(res.Recovery) == 0 || res.Recovery[0] == 0 {
		return 0, fmt.Errorf("%s: training did not resume (succeeded=%v: %s)", spec, res.Succeeded, res.Message)
	}
	return res.Recovery[0], nil
}

// torchrunRun runs two torchrun nodes (c10d, --nnodes 2:2) and injects the
// fault at step 10: kill-worker (kill -9 of node 1's worker) or
// replace-node (SIGTERM to node 1's torchrun, a new one started at once);
// the recovery ends at the first step after a worker printed that it
// (re)started after the fault.
func torchrunRun(scriptAbs, fault string) (time.Duration, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "bench-recovery-torchrun")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	lines := make(chan string, 1024)
	var wg sync.WaitGroup
	start := func(node int) *exec.Cmd {
		cmd := exec.Command(python, "-m", "torch.distributed.run", "--nnodes", "2:2", "--nproc_per_node", "1", "--max_restarts", "3",
			"--monitor_interval", "1", "--redirects", "2", "--tee", "2", "--rdzv_backend", "c10d",
			"--rdzv_endpoint", "127.0.0.1:"+strconv.Itoa(port), "--rdzv_id", "bench",
			scriptAbs, "--steps", "100000", "--sleep", "0.05", "--ckpt-every", "5", "--ckpt-dir", filepath.Join(dir, "ckpt"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		pr, pw := io.Pipe()
		cmd.Stdout, cmd.Stderr = pw, pw
		if err := cmd.Start(); err != nil {
			return nil
		}
		wg.Go(func() {
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				select {
				case lines <- sc.Text():
				default:
				}
			}
		})
		go func() { _ = cmd.Wait(); pw.Close() }()
		return cmd
	}
	nodes := []*exec.Cmd{start(0), start(1)}
	defer func() {
		for _, c := range nodes {
			if c != nil {
				_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			}
		}
	}()
	if nodes[0] == nil || nodes[1] == nil {
		return 0, fmt.Errorf("torchrun did not start")
	}
	deadline := time.After(3 * time.Minute)
	var faultAt time.Time
	restarted := false
	for {
		select {
		case <-deadline:
			return 0, fmt.Errorf("torchrun %s: no recovery in 3 min", fault)
		case line := <-lines:
			switch {
			case faultAt.IsZero() && strings.Contains(line, "step = 10"):
				faultAt = time.Now()
				if fault == "kill-worker" {
					pid := workerOf(nodes[1].Process.Pid)
					if pid == 0 {
						return 0, fmt.Errorf("node 1's worker not found")
					}
					_ = syscall.Kill(pid, syscall.SIGKILL)
				} else {
					_ = nodes[1].Process.Signal(syscall.SIGTERM)
					nodes = append(nodes, start(1))
				}
			case !faultAt.IsZero() && strings.Contains(line, "resumed from step"):
				restarted = true
			case restarted && strings.Contains(line, "step = "):
				return time.Since(faultAt), nil
			}
		}
	}
}

// workerOf is the training process under a torchrun: the descendant with
// LOCAL_RANK in its environment.
func workerOf(pid int) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == pid {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if !strings.Contains(string(env), "LOCAL_RANK=0\x00") {
			continue
		}
		for q := p; q > 1; {
			stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(q), "stat"))
			if err != nil {
				break
			}
			f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
			q, _ = strconv.Atoi(f[1])
			if q == pid {
				return p
			}
		}
	}
	return 0
}
