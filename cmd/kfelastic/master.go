package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kfelastic/kfelastic/internal/jobtoken"
	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/master/kube"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

// masterFlags are `kfelastic master`'s flags (docs/DESIGN.md §5).
type masterFlags struct {
	listen            string
	nnodes            string
	rdzvID            string
	tokenFile         string
	state             string
	stateTimeout      time.Duration
	nodeUnit          int
	waitingTimeout    time.Duration
	expectedNodes     int
	joinTimeout       time.Duration
	pendTimeout       time.Duration
	heartbeatInterval time.Duration
	heartbeatTimeout  time.Duration
	networkCheck      bool
	excludeStraggler  bool
	checkTimeout      time.Duration
	maxRelaunches     int
	oomFactor         float64
	oomMaxIncrement   string
	oomMaxMemory      string
	metricsListen     string
	kubeNamespace     string
	kubeJob           string
	taintFailedNodes  bool
	nodeEvents        string
	errorPrefix       string
	transport         string
}

// masterServe is what the command runs with the parsed options (tests
// capture them instead).
type masterServe func(ctx context.Context, opts master.Options, f *masterFlags) error

func init() { rootCmd.AddCommand(newMasterCmd(serveMaster)) }

func newMasterCmd(run masterServe) *cobra.Command {
	var f masterFlags
	cmd := &cobra.Command{
		Use:   "master --nnodes MIN:MAX --token-file FILE --state URL [flags]",
		Short: "Serve an elastic job's rendezvous, health checks, relaunch policy and torch store",
		Long: `master is the elastic job's coordinator (docs/DESIGN.md §5). Agents (kfelastic agent --rdzv-endpoint
HOST:PORT --token-file FILE) join rounds of MIN..MAX nodes through it, heartbeat, run the node
health check when --network-check is on, and leave with their outcome; the master decides
relaunches (preempted: relaunch, not counted; OOM: relaunch with more memory; faulty node or
straggler: relaunch elsewhere; user error: none; --max-relaunches per rank) and, with
--kube-namespace/--kube-job, carries them out on Kubernetes itself. Every call must carry the
job token. State (rounds, nodes, decisions, the torch store) is written under --state before
any call is answered, so a restarted master goes on where it stopped.

Heartbeats are tighter than DLRover's (15 s, dead after 600 s): a silent node is noticed after
--heartbeat-timeout, which with pods replaced in seconds is most of the recovery time; the cost
is one small call per node per --heartbeat-interval, answered from memory.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := f.options()
			if err != nil {
				return err
			}
			return run(cmd.Context(), opts, &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", ":29500", "HOST:PORT to serve the agents on")
	fl.StringVar(&f.nnodes, "nnodes", "", "MIN:MAX nodes of a round (required)")
	fl.StringVar(&f.rdzvID, "rdzv-id", "none", "the job's id (the agents' --rdzv-id); the state under --state must be this job's")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the job token every call must carry (required)")
	fl.StringVar(&f.state, "state", "", "URL of the durable state (file://, s3://, mem://) (required; mem:// does not survive a restart)")
	fl.DurationVar(&f.stateTimeout, "state-timeout", master.DefaultStateTimeout, "how long the start may wait for --state to be opened and read before it fails (logged every few seconds meanwhile) (> 0)")
	fl.IntVar(&f.nodeUnit, "node-unit", 1, "rounds have a multiple of this many nodes (≥ 1)")
	fl.IntVar(&f.expectedNodes, "expected-nodes", 0, "how many nodes the job was created with (its Worker replicas; 0: unknown): once that many wait, the round completes without the last call")
	fl.DurationVar(&f.waitingTimeout, "waiting-timeout", master.DefaultWaitingTimeout, "last call: with at least MIN nodes, complete the round once this passed since the last join (> 0)")
	fl.DurationVar(&f.joinTimeout, "join-timeout", master.DefaultJoinTimeout, "a node waiting this long for a round exits with RendezvousTimeout (> 0)")
	fl.DurationVar(&f.pendTimeout, "pend-timeout", master.DefaultPendTimeout, "the job stops when fewer than MIN nodes wait this long, and a replacement waits at most this long for the rank its old pod still holds (> 0)")
	fl.DurationVar(&f.heartbeatInterval, "heartbeat-interval", master.DefaultHeartbeatInterval, "how long a heartbeat is held when there is nothing to say (> 0)")
	fl.DurationVar(&f.heartbeatTimeout, "heartbeat-timeout", master.DefaultHeartbeatTimeout, "a node silent this long is lost: its rank leaves and is relaunched (> --heartbeat-interval)")
	fl.BoolVar(&f.networkCheck, "network-check", false, "run the 2-round node health check before a round with a node that has not passed it")
	fl.BoolVar(&f.excludeStraggler, "exclude-straggler", false, "with --network-check: exclude nodes slower than 2× the median (else they are only reported)")
	fl.DurationVar(&f.checkTimeout, "check-timeout", master.DefaultCheckTimeout, "a check round's bound; a node without a report by then failed it (> 0)")
	fl.IntVar(&f.maxRelaunches, "max-relaunches", relaunch.DefaultPolicy.MaxPerRank, "counted relaunches per rank (preemptions are not counted) (≥ 0)")
	fl.Float64Var(&f.oomFactor, "oom-factor", relaunch.DefaultOOM.Factor, "memory factor of a pod relaunched after an OOM kill (> 1)")
	fl.StringVar(&f.oomMaxIncrement, "oom-max-increment", "8Gi", "largest memory increase of one OOM relaunch (a quantity; 0: none)")
	fl.StringVar(&f.oomMaxMemory, "oom-max-memory", "64Gi", "memory cap of OOM relaunches (a quantity; 0: none)")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "HOST:PORT to serve Prometheus metrics on /metrics (empty: off)")
	fl.StringVar(&f.kubeNamespace, "kube-namespace", "", "with --kube-job: carry out relaunch decisions on this Kubernetes namespace's PyTorchJob (in-cluster credentials)")
	fl.StringVar(&f.kubeJob, "kube-job", "", "the PyTorchJob whose pods this master owns (see --kube-namespace)")
	fl.BoolVar(&f.taintFailedNodes, "taint-failed-nodes", false, "with --kube-job: also taint ("+kube.UnhealthyTaint+":NoSchedule) a node a pod is relaunched away from (hardware fault, lost node, failed node check); needs get and update on nodes (a ClusterRole)")
	fl.StringVar(&f.nodeEvents, "node-events-namespace", "default", "with --kube-job: also read the GPU faults health daemons record against the job's nodes from this namespace's events (where the kubelet and node-problem-detector put them), if a Role there grants the master list and watch on events (empty: only the faults recorded against the pods)")
	fl.StringVar(&f.transport, "transport", "", "how the gRPC service is served: lean (the master's own HTTP/2 server: under half of grpc-go's memory per agent) or grpc (grpc-go's server, to fall back on); empty: $"+master.TransportEnv+", else "+string(master.DefaultTransport)+" (docs/DESIGN.md §5.11)")
	fl.StringVar(&f.errorPrefix, "error-prefix", "", "the job's error prefix (the agents'): the master appends a relaunch event there for each relaunch it decides, for kfelastic report (empty: none)")
	return cmd
}

func (f *masterFlags) options() (master.Options, error) {
	var o master.Options
	if f.nnodes == "" {
		return o, errors.New("--nnodes MIN:MAX is required")
	}
	lo, hi, err := parseNNodes(f.nnodes)
	if err != nil {
		return o, err
	}
	if f.tokenFile == "" {
		return o, errors.New("--token-file is required: every call must carry the job token")
	}
	token, err := jobtoken.Read(f.tokenFile)
	if err != nil {
		return o, fmt.Errorf("--token-file: %w", err)
	}
	if f.state == "" {
		return o, errors.New("--state URL is required (file://, s3://; mem:// keeps nothing across restarts)")
	}
	if _, _, err := net.SplitHostPort(f.listen); err != nil {
		return o, fmt.Errorf("--listen %q: %w", f.listen, err)
	}
	t, err := master.ParseTransport(f.transport)
	if err != nil {
		return o, fmt.Errorf("--transport: %w", err)
	}
	if f.metricsListen != "" {
		if _, _, err := net.SplitHostPort(f.metricsListen); err != nil {
			return o, fmt.Errorf("--metrics-listen %q: %w", f.metricsListen, err)
		}
	}
	for name, d := range map[string]time.Duration{"--waiting-timeout": f.waitingTimeout, "--join-timeout": f.joinTimeout,
		"--pend-timeout": f.pendTimeout, "--heartbeat-interval": f.heartbeatInterval, "--heartbeat-timeout": f.heartbeatTimeout,
		"--check-timeout": f.checkTimeout, "--state-timeout": f.stateTimeout} {
		if d <= 0 {
			return o, fmt.Errorf("%s %s: want a positive duration", name, d)
		}
	}
	if f.heartbeatTimeout <= f.heartbeatInterval {
		return o, fmt.Errorf("--heartbeat-timeout %s must exceed --heartbeat-interval %s", f.heartbeatTimeout, f.heartbeatInterval)
	}
	if f.expectedNodes != 0 && (f.expectedNodes < lo || f.expectedNodes > hi) {
		return o, fmt.Errorf("--expected-nodes %d: want 0 or MIN ≤ N ≤ MAX (%d:%d)", f.expectedNodes, lo, hi)
	}
	if f.nodeUnit < 1 || f.nodeUnit > hi {
		return o, fmt.Errorf("--node-unit %d: want 1 ≤ N ≤ MAX (%d)", f.nodeUnit, hi)
	}
	if f.maxRelaunches < 0 {
		return o, fmt.Errorf("--max-relaunches %d: want ≥ 0", f.maxRelaunches)
	}
	if f.oomFactor <= 1 || f.oomFactor > 100 {
		return o, fmt.Errorf("--oom-factor %g: want a number in (1, 100]", f.oomFactor)
	}
	inc, err := quantity("--oom-max-increment", f.oomMaxIncrement)
	if err != nil {
		return o, err
	}
	cap, err := quantity("--oom-max-memory", f.oomMaxMemory)
	if err != nil {
		return o, err
	}
	if (f.kubeNamespace == "") != (f.kubeJob == "") {
		return o, errors.New("--kube-namespace and --kube-job go together")
	}
	o = master.Options{
		Token:             token,
		StateURL:          f.state,
		StateTimeout:      f.stateTimeout,
		EventsURL:         f.errorPrefix,
		HeartbeatInterval: f.heartbeatInterval,
		Transport:         t,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, nil)),
		Job: master.Config{
			JobID: f.rdzvID, MinNodes: lo, MaxNodes: hi, NodeUnit: f.nodeUnit,
			WaitingTimeout: f.waitingTimeout, ExpectedNodes: f.expectedNodes, JoinTimeout: f.joinTimeout, PendTimeout: f.pendTimeout,
			HeartbeatTimeout: f.heartbeatTimeout, NetworkCheck: f.networkCheck, ExcludeStraggler: f.excludeStraggler,
			CheckTimeout: f.checkTimeout,
			Relaunch: relaunch.Policy{MaxPerRank: f.maxRelaunches,
				OOM: relaunch.OOM{Factor: f.oomFactor, MaxIncrement: inc, Max: cap}},
		},
	}
	return o, nil
}

func quantity(flag, s string) (int64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() < 0 {
		return 0, fmt.Errorf("%s %q: want a non-negative quantity like 8Gi", flag, s)
	}
	return q.Value(), nil
}

// serveMaster runs the master until SIGTERM.
func serveMaster(ctx context.Context, opts master.Options, f *masterFlags) error {
	log := opts.Logger
	if f.kubeJob != "" {
		owner, err := kubeOwner(f.kubeNamespace, f.kubeJob, opts.Job.Relaunch.OOM, f.taintFailedNodes, f.nodeEvents, log)
		if err != nil {
			return err
		}
		opts.Owner = owner
		// The Master replica must complete for the operator to end the
		// PyTorchJob (it decides on the Master's exit): Succeeded, and the
		// plugin reads the error documents (a stopped job's master writes
		// one of its own).
		opts.ExitWhenDone = true
		// A departed pod's replacement may never train (its node avoided,
		// no room elsewhere): the job that goes on without it recovered
		// from its failure.
		opts.SupersedeDeparted = true
		opts.Pod, _ = os.Hostname()
	}
	s, err := master.NewServer(ctx, opts)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	if f.metricsListen != "" {
		ml, err := net.Listen("tcp", f.metricsListen)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", s.MetricsHandler())
		if os.Getenv("KFELASTIC_PPROF") == "1" {
			// Go's profiles, for whoever looks into the master's memory or CPU.
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ml) }()
		defer srv.Close()
	}
	if w, ok := opts.Owner.(podWatcher); ok {
		go w.WatchFor(ctx, s)
	}
	if w, ok := opts.Owner.(podWarningWatcher); ok {
		go w.WatchPodWarningsFor(ctx, s)
	}
	cfg := s.Job()
	log.Info("master serving", "listen", lis.Addr().String(), "job", cfg.JobID, "nnodes", strconv.Itoa(cfg.MinNodes)+":"+strconv.Itoa(cfg.MaxNodes),
		"node_unit", cfg.NodeUnit, "waiting_timeout", cfg.WaitingTimeout, "expected_nodes", cfg.ExpectedNodes, "heartbeat_interval", opts.HeartbeatInterval,
		"heartbeat_timeout", cfg.HeartbeatTimeout, "network_check", cfg.NetworkCheck, "exclude_straggler", cfg.ExcludeStraggler,
		"state", opts.StateURL, "metrics", f.metricsListen, "transport", opts.Transport)
	if err := s.Serve(ctx, lis); err != nil {
		return err
	}
	if opts.ExitWhenDone && !s.Succeeded() && !s.StoppedForGood() {
		// Stopped (SIGTERM: the pod deleted, the node drained) with the
		// job unfinished: exit 0 would read as the Master replica's success,
		// and the training operator would mark the running job Succeeded
		// instead of replacing the master. 143, as a shell reports SIGTERM.
		return exitStatus(143)
	}
	return nil
}

// podWarningWatcher is an owner that also reports the Warning events on
// the job's pods the master acts on (GPU faults, nodes not ready).
type podWarningWatcher interface {
	WatchPodWarningsFor(ctx context.Context, s *master.Server)
}

// podWatcher is an owner that also reports pods that died without their
// agent saying so.
type podWatcher interface {
	WatchFor(ctx context.Context, s *master.Server)
}
