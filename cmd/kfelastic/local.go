package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kfelastic/kfelastic/internal/stopsignal"
	"github.com/kfelastic/kfelastic/internal/termsafe"
	"github.com/kfelastic/kfelastic/local"
)

// localFlags are `kfelastic local`'s flags (docs/DESIGN.md §6).
type localFlags struct {
	nnodes, nproc, launcher, out, job, memory, binary string
	network                                           string
	maxRestarts, slots, maxRelaunches                 int
	tfPS, tfWorkers, maxWorkers                       int
	chaos                                             []string
	networkCheck, excludeStraggler                    bool
	heartbeatInterval, heartbeatTimeout, waiting      time.Duration
	checkTimeout, grace                               time.Duration
}

func init() { rootCmd.AddCommand(newLocalCmd()) }

func newLocalCmd() *cobra.Command {
	var f localFlags
	cmd := &cobra.Command{
		Use:   "local --nnodes MIN:MAX --nproc-per-node N [flags] [--chaos SPEC]... -- CMD ARGS...",
		Short: "Run a whole elastic job on this machine, with fault injection",
		Long: `local runs an elastic job on this machine as it would run on Kubernetes (docs/DESIGN.md §6): the
kfelastic master in-process, and one "pod" per node: a kfelastic agent process (its own
process group, and cgroup where the machine has them) named <job>-worker-<i> as the
training operator names pods. It carries out the master's relaunch decisions as the
operator would: a replacement takes the next index and keeps the rank; after an OOM
kill it gets twice the memory (cgroup memory limit where it can, else an address-space
limit; it says which). With fewer --slots than MAX, pods wait pending for a slot.

--chaos ACTION:TARGET@WHEN injects a fault, for real; repeatable. TARGET is a node rank
(1), or for kill-worker a worker (1/0: node 1, local rank 0); add-slot and kill-master
take none (add-slot@step=20). WHEN is step=N (once any worker printed step N or later:
"step = N" as DLRover's examples print it, or "step N") or after=DURATION (since the
start); without it, at once. Actions:
  delete-pod   SIGTERM to the pod (a preemption), SIGKILL after --grace
  kill-worker  kill -9 of one training process
  straggler    throttles the pod's CPU to 10% of one (cgroup cpu quota) from the start
  break-check  kills the pod's health-check processes, every round
  cut-network  the pod's link goes down (as root: each pod in its own network namespace
               on a bridge, --network; otherwise the pod is frozen, which its peers and
               the master see as a lost network)
  oom          a process in the pod's memory cgroup allocates past the limit
  fail-pod     the pod's machine fails, and its relaunches fail too
  add-slot     one more slot frees (scale up)
  kill-master  the master stops and restarts with its state
A bad spec is refused before anything starts.

--tf-ps N --tf-workers M makes it a TensorFlow parameter-server job as the training
operator runs a TFJob (no --nnodes): pods <job>-chief-0, <job>-ps-<i>, <job>-worker-<i>,
each with TF_CONFIG and its process under a single-node agent; a failed pod is
recreated under its own name and index. --chaos targets: 0 is the chief, 1..N the ps,
N+1.. the workers. examples/tfps/ps_standin.py is a stand-in for such a job.

Output goes to --out, a new or empty folder (one that holds anything, an earlier
job's above all, is refused: a job never reloads another's state): errors/ (the pods'
error documents, file://), pods/<pod>.log, the master's state and log, and report.html
(kfelastic report). Without --out, a new folder out/JOB-YYYYMMDD-HHMMSS (-2, -3, …
when that exists). While it runs it shows the pods, ranks, round, restarts and last
step; at the end the root cause as the Flyte UI shows it. Ctrl-C stops every process
it started. Exit status: 0 when the job succeeded, 1 when it failed, 128+N when signal N
interrupted it (130 for Ctrl-C, 143 for SIGTERM), as a shell reports it.`,
		Args:          cobra.MinimumNArgs(1),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := f.options(args)
			if err != nil {
				return err
			}
			return runLocal(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.SetInterspersed(false)
	fl.StringVar(&f.nnodes, "nnodes", "", "MIN:MAX nodes (pods) of the job (required)")
	fl.StringVar(&f.nproc, "nproc-per-node", "1", "workers per pod (1 to 1024)")
	fl.IntVar(&f.maxRestarts, "max-restarts", 3, "each agent's restarts of its workers before the pod fails (≥ 0)")
	fl.IntVar(&f.slots, "slots", 0, "pods that can run at once (0: MAX); the others wait pending")
	fl.StringVar(&f.launcher, "launcher", "agent", "the agents' launcher: agent or command")
	fl.StringVar(&f.out, "out", "", "the job's folder, new or empty (default: a new folder under ./out, out/JOB-YYYYMMDD-HHMMSS[-N])")
	fl.StringVar(&f.job, "job", "local", "the job's name: pods are <job>-worker-<i>")
	fl.StringArrayVar(&f.chaos, "chaos", nil, "ACTION:TARGET@WHEN fault to inject (repeatable; see above)")
	fl.StringVar(&f.memory, "memory", "0", "each pod's memory limit, a quantity like 2Gi (0: none; oom without one: 2Gi)")
	fl.IntVar(&f.maxRelaunches, "max-relaunches", 3, "counted relaunches per rank (preemptions are not counted) (≥ 1)")
	fl.BoolVar(&f.networkCheck, "network-check", false, "the master runs the node health check before training")
	fl.BoolVar(&f.excludeStraggler, "exclude-straggler", false, "with --network-check: a node slower than 2× the median exits with a Straggler document")
	fl.DurationVar(&f.heartbeatInterval, "heartbeat-interval", time.Second, "the master's heartbeat interval")
	fl.DurationVar(&f.heartbeatTimeout, "heartbeat-timeout", 8*time.Second, "a pod silent this long is lost (at least 8s: the agents' heartbeat is a 5 s long poll)")
	fl.DurationVar(&f.waiting, "waiting-timeout", 2*time.Second, "a round of at least MIN pods completes this long after the last join")
	fl.DurationVar(&f.checkTimeout, "check-timeout", 60*time.Second, "bound on one health-check round")
	fl.DurationVar(&f.grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL for a deleted pod, and the agents' --stop-grace")
	fl.StringVar(&f.binary, "binary", "", "the kfelastic binary the pods run (default: this one)")
	fl.StringVar(&f.network, "network", "", "pods' network: host (this machine's loopback), netns (a network namespace each, on a bridge; root), or empty: netns when a cut-network needs it and it can be had")
	fl.IntVar(&f.tfPS, "tf-ps", 0, "a TensorFlow PS job with this many parameter servers (with --tf-workers; see above)")
	fl.IntVar(&f.tfWorkers, "tf-workers", 0, "a TensorFlow PS job with this many workers besides its chief")
	fl.IntVar(&f.maxWorkers, "max-workers", 0, "refuse a job of more workers (MAX pods × workers per pod) than this (0: what this machine holds, 4 per CPU; -1: no bound)")
	return cmd
}

func (f *localFlags) options(command []string) (local.Options, error) {
	var o local.Options
	var tf *local.TF
	if f.tfPS > 0 || f.tfWorkers > 0 {
		if f.tfPS < 1 || f.tfWorkers < 0 {
			return o, fmt.Errorf("--tf-ps %d --tf-workers %d: want at least one ps and no negative count", f.tfPS, f.tfWorkers)
		}
		tf = &local.TF{PS: f.tfPS, Workers: f.tfWorkers}
		f.nnodes = fmt.Sprint(tf.Replicas())
	}
	if f.nnodes == "" {
		return o, errors.New("--nnodes MIN:MAX is required")
	}
	lo, hi, err := parseNNodes(f.nnodes)
	if err != nil {
		return o, err
	}
	n, err := parseNProc(f.nproc)
	if err != nil {
		return o, err
	}
	if f.launcher != "agent" && f.launcher != "command" {
		return o, fmt.Errorf("--launcher %q: want agent or command", f.launcher)
	}
	mem, err := quantity("--memory", f.memory)
	if err != nil {
		return o, err
	}
	switch {
	case f.maxRestarts < 0:
		return o, fmt.Errorf("--max-restarts %d: want ≥ 0", f.maxRestarts)
	case f.slots < 0:
		return o, fmt.Errorf("--slots %d: want ≥ 0", f.slots)
	case f.maxRelaunches < 1:
		return o, fmt.Errorf("--max-relaunches %d: want ≥ 1", f.maxRelaunches)
	case f.heartbeatTimeout <= f.heartbeatInterval:
		return o, fmt.Errorf("--heartbeat-timeout %s must exceed --heartbeat-interval %s", f.heartbeatTimeout, f.heartbeatInterval)
	}
	for name, d := range map[string]time.Duration{"--heartbeat-interval": f.heartbeatInterval, "--waiting-timeout": f.waiting,
		"--check-timeout": f.checkTimeout, "--grace": f.grace} {
		if d <= 0 {
			return o, fmt.Errorf("%s %s: want a positive duration", name, d)
		}
	}
	if f.network != "" && f.network != "host" && f.network != "netns" {
		return o, fmt.Errorf("--network %q: want host or netns", f.network)
	}
	var chaos []local.Chaos
	for _, s := range f.chaos {
		c, err := local.ParseChaos(s)
		if err != nil {
			return o, err
		}
		if err := c.Check(hi, n); err != nil {
			return o, err
		}
		chaos = append(chaos, c)
	}
	o = local.Options{Job: f.job, MinNodes: lo, MaxNodes: hi, NProcPerNode: n, MaxRestarts: f.maxRestarts, Slots: f.slots,
		Launcher: f.launcher, Out: f.out, Chaos: chaos, Command: command, Binary: f.binary, Memory: mem, MaxRelaunches: f.maxRelaunches,
		NetworkCheck: f.networkCheck || f.excludeStraggler, ExcludeStraggler: f.excludeStraggler, HeartbeatInterval: f.heartbeatInterval,
		HeartbeatTimeout: f.heartbeatTimeout, WaitingTimeout: f.waiting, CheckTimeout: f.checkTimeout, Grace: f.grace, Network: f.network, TF: tf,
		MaxWorkers: f.maxWorkers}
	// Before the output folder is made and the first line said: a bad job
	// name or --binary, or a job the machine cannot hold, starts nothing.
	return o, o.Validate()
}

// runLocal runs the job, then prints how it ended and writes its report.
func runLocal(ctx context.Context, opts local.Options, out io.Writer) error {
	opts.View = out
	if fl, ok := out.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(fl.Fd()), unix.TCGETS)
		opts.Live = err == nil
	}
	if opts.Out == "" {
		// A new folder per job, even for two started in the same second.
		dir, err := local.NewOutFolder(filepath.Join("out", opts.Job+"-"+time.Now().UTC().Format("20060102-150405")))
		if err != nil {
			return fmt.Errorf("output folder: %w", err)
		}
		opts.Out = dir
	}
	fmt.Fprintf(out, "kfelastic local: job %s, %d:%d pods of %d workers, output in %s\n", opts.Job, opts.MinNodes, opts.MaxNodes, opts.NProcPerNode, termsafe.Line(opts.Out))
	res, err := local.Run(ctx, opts)
	if res == nil {
		return err
	}
	if err != nil {
		fmt.Fprintf(out, "\nkfelastic local: interrupted (%v); every process it started is stopped\n", err)
	}
	fmt.Fprintln(out)
	switch {
	case res.Succeeded && res.Message == "":
		fmt.Fprintln(out, "The job succeeded; no error documents.")
	case res.Succeeded:
		fmt.Fprintln(out, "The job succeeded; it recovered from failures. The earliest, as the Flyte UI would show it:")
		fmt.Fprintln(out, indent(termsafe.Text(res.Message), "  "))
	case res.Message != "":
		fmt.Fprintln(out, "The job failed. Root cause, as the Flyte UI shows it:")
		fmt.Fprintln(out, indent(termsafe.Text(res.Message), "  "))
	default:
		fmt.Fprintln(out, "The job failed without any error document.")
	}
	if res.Stopped != "" {
		fmt.Fprintf(out, "The master stopped the job: %s\n", termsafe.Line(res.Stopped))
	}
	fmt.Fprintf(out, "Documents: %s\n", termsafe.Line(res.Documents))
	html := filepath.Join(opts.Out, "report.html")
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if rerr := runReport(rctx, reportConfig{URL: res.Documents, Output: html, Concurrency: 32, OpenLanes: 30, Timeout: defaultTimeout}, io.Discard); rerr != nil {
		fmt.Fprintf(out, "Report: not written: %s\n", termsafe.Line(rerr.Error()))
	} else {
		abs, _ := filepath.Abs(html)
		fmt.Fprintf(out, "Report: %s\n", termsafe.Line(abs))
	}
	if err != nil {
		// Interrupted: 128+N for signal N (130 for Ctrl-C), as a shell
		// reports a command a signal ended, so that a script or CI tells
		// an interruption from a failed job (1) and stops rather than
		// reading the job's outcome; the agent exits so too (Signal<NAME>).
		var sig stopsignal.Signaled
		if errors.As(err, &sig) && sig.Signal != 0 {
			return &exitError{code: 128 + int(sig.Signal), msg: "interrupted: " + sig.Error()}
		}
		return err
	}
	if !res.Succeeded {
		return &exitError{code: 1, msg: "the job failed"}
	}
	return nil
}
