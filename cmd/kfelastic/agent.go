package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/kfelastic/kfelastic/agent"
	"github.com/kfelastic/kfelastic/internal/nonblocking"
)

// agentFlags are torchrun's flags (both spellings, as torchrun's argparse
// accepts them) plus kfelastic's own.
type agentFlags struct {
	nprocPerNode    string
	nnodes          string
	maxRestarts     int
	rdzvEndpoint    string
	rdzvID          string
	rdzvBackend     string
	rdzvConf        string
	nodeRank        int
	masterAddr      string
	masterPort      int
	logDir          string
	standalone      bool
	monitorInterval float64
	redirects       string
	tee             string
	startMethod     string
	networkCheck    bool
	excludeStrag    bool
	errorPrefix     string
	hangTimeout     time.Duration
	dumpSignal      string
	dumpTimeout     time.Duration
	stopGrace       time.Duration
	storageTimeout  time.Duration
	warmSpares      bool
	preload         string
	tokenFile       string
	storeProxy      bool
	forkServer      bool
	launcher        string
}

func init() { rootCmd.AddCommand(newAgentCmd(agent.Run)) }

// newAgentCmd is the agent subcommand; run receives the config (agent.Run,
// or a test's capture).
func newAgentCmd(run func(context.Context, agent.Config) error) *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use:   "agent [flags] -- CMD ARGS...",
		Short: "Supervise the local training workers, as torchrun does",
		Long: `agent replaces torchrun in a training pod: it starts --nproc-per-node workers with
torchrun's environment, restarts them on failure within --max-restarts, and writes the
pod's error document to --error-prefix when it gives up. Flags default to the PET_* env
vars the Kubeflow training operator injects (flags win).

Child exits are observed as events, so --monitor-interval is accepted and ignored.
--network-check and --exclude-straggler are accepted; they are carried out by the
kfelastic master, which this agent does not talk to yet. --redirects and --tee are
accepted; the agent always keeps per-worker logs under --log-dir and tees them,
prefixed with "[default<local rank>]:", to its own output.

On the node of group rank 0 the agent itself listens on MASTER_PORT (--store-proxy,
on by default) and forwards the workers' store connections to the rank-0 worker's
store on a private port: torch 1.13 retries a refused store connection only after
a whole second, which a worker that starts before rank 0 has bound its port would
otherwise wait out. Rank 0's MASTER_PORT is that private port; torchrun gives all
workers the same one. --store-proxy=false restores that.

--launcher command runs the command once, for one that starts its own workers
through torch elastic (flytekit's pyflyte-execute, a script calling elastic_launch
or torchrun): torch restarts them (PET_MAX_RESTARTS; the agent never restarts the
command), and the command's PET_RDZV_ENDPOINT is the agent's loopback relay to the
master's store (0.0.0.0:PORT, so that torch never tries to host the store there;
PET_RDZV_BACKEND=c10d, is_host=false in PET_RDZV_CONF), so torch's c10d
rendezvous lives in the master. The agent joins
the master first (node check included); a master round that changes later does
not stop the command, the master's EXIT does. The dump signal goes to torch's
workers (never to multiprocessing's resource tracker). A document the command
wrote itself for the pod (flytekit: error-<uuid>.pb, torch's whole second) is
refined to its worker's failure time.

Restarts are as fast as a fork (--fork-server, on by default): for a
"python SCRIPT" or "python -m MODULE" command the agent keeps one interpreter with
--preload imported and forks each worker from it; the workers share its pages.
Its memory (one idle interpreter per pod) is logged when it is ready.
--fork-server=false starts every worker with exec; --warm-spares (which turns the
fork server off) pre-starts whole interpreters instead, for scripts that cannot be
forked. Under --launcher command the same flag has torch's own agent in the command
fork the workers it would spawn (flytekit's start method) from multiprocessing's
forkserver, started with --preload at the command's start (a sitecustomize.py the
agent puts first on the command's PYTHONPATH; docs/DESIGN.md §4.7).

Signals: SIGTERM is a preemption (--dump-signal, --dump-timeout, then the stop;
a Preempted document, exit 143). SIGINT, SIGHUP and SIGQUIT stop the workers
without the dump (a Signal<NAME> document, exit 128+N). A repeated signal is
ignored; SIGPIPE is ignored (a closed stdout is given up, training goes on).
Nothing the workers start outlives the agent, even a SIGKILLed one: its guardian
process kills what is left.

The pod's document is kept in --log-dir and uploaded to --error-prefix, retried
until --storage-timeout. The pod's events (group started, worker exited, restart,
pod failed or succeeded) are appended under events/ there, in the background;
--storage-timeout bounds each write too.`,
		Args:          cobra.MinimumNArgs(1),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := applyNodeRankEnv(cmd.Flags()); err != nil {
				return err
			}
			if err := applyPETEnv(cmd.Flags()); err != nil {
				return err
			}
			cfg, err := f.config(args)
			if err != nil {
				return err
			}
			if f.monitorInterval != 0 && cmd.Flags().Changed("monitor-interval") {
				cfg.Logger.Info("monitor interval ignored: the agent observes worker exits as events", "monitor_interval", f.monitorInterval)
			}
			if f.networkCheck || f.excludeStrag {
				cfg.Logger.Warn("network check and straggler exclusion need the kfelastic master; not carried out by this agent",
					"network_check", f.networkCheck, "exclude_straggler", f.excludeStrag)
			}
			err = run(cmd.Context(), cfg)
			nonblocking.CloseOutputs(2*time.Second, cfg.Stdout, cfg.Stderr)
			return err
		},
	}
	fl := cmd.Flags()
	// Flags end at the worker command, as with torchrun: its own flags are its.
	fl.SetInterspersed(false)
	// torchrun accepts --nproc_per_node and --nproc-per-node alike.
	fl.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
	})
	fl.StringVar(&f.nprocPerNode, "nproc-per-node", "1", fmt.Sprintf("workers per node: 1 to %d, or auto/cpu (one per CPU)", agent.MaxNProcPerNode))
	fl.StringVar(&f.nnodes, "nnodes", "1:1", "number of nodes, N or MIN:MAX (1 ≤ MIN ≤ MAX)")
	fl.IntVar(&f.maxRestarts, "max-restarts", 0, "restarts of the local group after worker failures before the pod fails (≥ 0)")
	fl.StringVar(&f.rdzvEndpoint, "rdzv-endpoint", "", fmt.Sprintf("rendezvous endpoint HOST[:PORT], the kfelastic master (PORT 1 to 65535, %d when left out, as torchrun; an IPv6 address in brackets: [::1]:%d)", defaultRdzvPort, defaultRdzvPort))
	fl.StringVar(&f.rdzvID, "rdzv-id", "none", "job id shared by the nodes (TORCHELASTIC_RUN_ID)")
	fl.StringVar(&f.rdzvBackend, "rdzv-backend", "static", "rendezvous backend: "+strings.Join(rdzvBackends, ", ")+" (all but static meet through the kfelastic master at --rdzv-endpoint)")
	fl.StringVar(&f.rdzvConf, "rdzv-conf", "", "accepted for torchrun compatibility; ignored")
	fl.IntVar(&f.nodeRank, "node-rank", -1, "stable rank of this node, 0 to nodes-1 (-1: assigned by the rendezvous)")
	fl.StringVar(&f.masterAddr, "master-addr", "", "with --rdzv-backend static on several nodes: where the workers meet")
	fl.IntVar(&f.masterPort, "master-port", 0, "with --rdzv-backend static on several nodes: the store's port (1 to 65535)")
	fl.StringVar(&f.logDir, "log-dir", "", "folder for per-worker logs and error files (default: a temporary folder)")
	fl.BoolVar(&f.standalone, "standalone", false, "single-node job with a local rendezvous")
	fl.Float64Var(&f.monitorInterval, "monitor-interval", 5, "accepted and ignored: exits are events (seconds ≥ 0)")
	fl.StringVar(&f.redirects, "redirects", "0", "accepted for torchrun compatibility (logs are always kept)")
	fl.StringVar(&f.tee, "tee", "0", "accepted for torchrun compatibility (output is always teed)")
	fl.StringVar(&f.startMethod, "start-method", "spawn", "accepted for torchrun compatibility; workers are always exec'd")
	fl.BoolVar(&f.networkCheck, "network-check", false, "run the node health check before training (needs the master)")
	fl.BoolVar(&f.excludeStrag, "exclude-straggler", false, "exit with a Straggler document when the check finds this node slow (needs the master)")
	fl.StringVar(&f.errorPrefix, "error-prefix", os.Getenv("KFELASTIC_ERROR_PREFIX"), "URL of the output prefix for the pod's error document (file://, s3://, mem://)")
	fl.DurationVar(&f.hangTimeout, "hang-timeout", 0, "fail a worker without output or progress-file touch for this long (≥ 0; 0: off)")
	fl.StringVar(&f.dumpSignal, "dump-signal", "", "signal sent to the workers on SIGTERM before stopping them: a name (SIGUSR1, USR1) or number 1 to 64 a worker can catch (not SIGKILL, SIGSTOP)")
	fl.DurationVar(&f.dumpTimeout, "dump-timeout", 60*time.Second, "how long the workers get after --dump-signal (≥ 0; 0: no dump)")
	fl.DurationVar(&f.stopGrace, "stop-grace", 10*time.Second, "time between SIGTERM and SIGKILL when stopping workers (> 0)")
	fl.DurationVar(&f.storageTimeout, "storage-timeout", agent.DefaultStorageTimeout, "how long the pod's error document upload is retried (it is always kept in --log-dir too), the bound on moving recovered documents at each group start, and on each event write (> 0)")
	fl.BoolVar(&f.warmSpares, "warm-spares", false, "for python SCRIPT workers: keep the next attempt's interpreters started, with --preload imported, so that a restart skips them (costs their memory)")
	fl.StringVar(&f.preload, "preload", "torch", "comma-separated modules the fork server (or, with --warm-spares, the spares) imports ahead")
	fl.BoolVar(&f.forkServer, "fork-server", true, "for python SCRIPT and python -m MODULE workers: fork each worker from one interpreter per pod that has imported --preload, so that a restart skips the interpreter start and the imports (costs one idle interpreter's memory; off with --warm-spares)")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the per-job token the kfelastic master requires on every call (the plugin mounts it from a Secret)")
	fl.StringVar(&f.launcher, "launcher", "agent", "who starts the workers: agent (the agent starts --nproc-per-node workers) or command (the command starts its own through torch elastic, as flytekit's pyflyte-execute does; the agent runs it once)")
	fl.BoolVar(&f.storeProxy, "store-proxy", true, "on the node of group rank 0, accept the workers' store connections on MASTER_PORT at once and forward them to rank 0's store on a private port, so that no worker waits out torch's 1 s retry of a refused connect; rank 0's MASTER_PORT then differs from the others' (torchrun gives all the same)")
	return cmd
}

// nodeRankEnv is kfoperator.NodeRankEnv: the plugin sets it to the worker
// pod's replica index (the binary does not link the plugin's builders).
const nodeRankEnv = "KFELASTIC_NODE_RANK"

// applyNodeRankEnv sets --node-rank, when not given, from the pod's replica
// index (nodeRankEnv, the plugin's downward-API env), which wins
// over the training operator's PET_NODE_RANK: with a Master replica the
// operator numbers workers from 1, so PET_NODE_RANK is one too many.
func applyNodeRankEnv(fl *pflag.FlagSet) error {
	v := os.Getenv(nodeRankEnv)
	if v == "" || fl.Changed("node-rank") {
		return nil
	}
	if err := fl.Set("node-rank", v); err != nil {
		return fmt.Errorf("%s=%q: %w", nodeRankEnv, v, err)
	}
	return nil
}

// applyPETEnv sets every flag not given on the command line from its PET_*
// env var (PET_NPROC_PER_NODE for --nproc-per-node), as torchrun does; an
// empty value counts as unset.
func applyPETEnv(fl *pflag.FlagSet) error {
	var err error
	fl.VisitAll(func(f *pflag.Flag) {
		if f.Changed || err != nil || staticOnlyPET[f.Name] {
			return
		}
		name := "PET_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := os.Getenv(name); v != "" {
			if e := fl.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	})
	if err != nil || fl.Lookup("rdzv-backend").Value.String() != "static" {
		return err
	}
	for name := range staticOnlyPET {
		if fl.Changed(name) {
			continue
		}
		env := "PET_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		if v := os.Getenv(env); v != "" {
			if e := fl.Set(name, v); e != nil {
				return fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	}
	return nil
}

// staticOnlyPET are the flags read from PET_* only with the static backend.
// The training operator sets PET_MASTER_ADDR/PORT on every pod of a job
// with a Master replica to that replica, which in an elastic job is the
// kfelastic master: taken as --master-addr, the agent would advertise the
// master's address as its own store's, and the workers would dial it.
var staticOnlyPET = map[string]bool{"master-addr": true, "master-port": true}

func (f *agentFlags) config(command []string) (agent.Config, error) {
	cfg := agent.Config{
		Command: command, MaxRestarts: f.maxRestarts, NodeRank: f.nodeRank,
		RdzvBackend: f.rdzvBackend, RdzvEndpoint: f.rdzvEndpoint, RdzvID: f.rdzvID,
		MasterAddr: f.masterAddr, MasterPort: f.masterPort, LogDir: f.logDir, ErrorPrefix: f.errorPrefix,
		WarmSpares: f.warmSpares, Preload: f.preload, TokenFile: f.tokenFile, NoStoreProxy: !f.storeProxy,
		NoForkServer: !f.forkServer,
		HangTimeout:  f.hangTimeout, DumpTimeout: f.dumpTimeout, StopGrace: f.stopGrace, StorageTimeout: f.storageTimeout, Tee: true,
		Pod: podName(),
		// Never blocked by a reader that does not read (nonblocking.Output).
		Stdout: nonblocking.NewOutput(os.Stdout), Stderr: nonblocking.NewOutput(os.Stderr),
	}
	// Key=value lines with millisecond times: restarts are sub-second.
	cfg.Logger = slog.New(slog.NewTextHandler(cfg.Stderr, nil))
	// Zero is these durations' default in agent.Config: refused here, not
	// silently replaced. The rest is checked by the agent (Config ranges).
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"stop-grace", f.stopGrace}, {"storage-timeout", f.storageTimeout}} {
		if err := durationIn(d.flag, d.v, time.Millisecond, 0); err != nil {
			return cfg, err
		}
	}
	if math.IsNaN(f.monitorInterval) || f.monitorInterval < 0 {
		return cfg, fmt.Errorf("--monitor-interval %v: want seconds ≥ 0", f.monitorInterval)
	}
	switch f.launcher {
	case "agent", "command":
		cfg.Launcher = f.launcher
	default:
		return cfg, fmt.Errorf("--launcher %q: want agent or command", f.launcher)
	}
	n, err := parseNProc(f.nprocPerNode)
	if err != nil {
		return cfg, err
	}
	cfg.NProcPerNode = n
	if cfg.MinNodes, cfg.MaxNodes, err = parseNNodes(f.nnodes); err != nil {
		return cfg, err
	}
	if f.standalone {
		cfg.MinNodes, cfg.MaxNodes = 1, 1
	}
	if f.dumpSignal != "" {
		if cfg.DumpSignal, err = parseSignal(f.dumpSignal); err != nil {
			return cfg, err
		}
	}
	if !slices.Contains(rdzvBackends, f.rdzvBackend) {
		return cfg, fmt.Errorf("--rdzv-backend %q: want one of %s", f.rdzvBackend, strings.Join(rdzvBackends, ", "))
	}
	// Refused here, at once: the agent would dial a malformed endpoint, and
	// retry it as an unreachable master for 10 minutes.
	if f.rdzvEndpoint != "" {
		if cfg.RdzvEndpoint, err = parseRdzvEndpoint(f.rdzvEndpoint); err != nil {
			return cfg, err
		}
	}
	return cfg, cfg.CheckRanges()
}

// podName is the pod's name as Flyte's plugin injects it (_F_WN, long name
// FLYTE_INTERNAL_WORKER_NAME), else POD_NAME, else the hostname (which is
// the pod name on Kubernetes).
func podName() string {
	for _, k := range []string{"_F_WN", "FLYTE_INTERNAL_WORKER_NAME", "POD_NAME"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	h, _ := os.Hostname()
	return h
}

func parseNProc(s string) (int, error) {
	switch s {
	case "auto", "cpu":
		return min(runtime.NumCPU(), agent.MaxNProcPerNode), nil
	case "gpu":
		return 0, fmt.Errorf("--nproc-per-node gpu: no GPUs are supported by this agent")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > agent.MaxNProcPerNode {
		return 0, fmt.Errorf("--nproc-per-node %q: want 1 to %d, auto or cpu", s, agent.MaxNProcPerNode)
	}
	return n, nil
}

// rdzvBackends are the --rdzv-backend values the agent accepts: torchrun's
// (torch.distributed.run registers static, c10d, etcd and etcd-v2; the
// training operator's ElasticPolicy allows c10d, etcd and etcd-v2, and the
// plugin passes the task's on) and its own name. Only static is met without
// the master: every other is the kfelastic master at --rdzv-endpoint.
var rdzvBackends = []string{"static", "c10d", "etcd", "etcd-v2", "kfelastic"}

// defaultRdzvPort is the port of an --rdzv-endpoint given without one, as
// torchrun has it (torch.distributed.run: the c10d backend's default port).
const defaultRdzvPort = 29400

// hostName is what torchrun accepts as an endpoint's host name (torch's
// parse_rendezvous_endpoint: labels of word characters, dots and dashes);
// IP addresses are parsed as such.
var hostName = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// parseRdzvEndpoint checks an --rdzv-endpoint (HOST, HOST:PORT, [IPv6] or
// [IPv6]:PORT) and returns it as HOST:PORT, with defaultRdzvPort where it
// has none, as torchrun does.
func parseRdzvEndpoint(s string) (string, error) {
	refuse := func(why string) (string, error) {
		return "", fmt.Errorf("--rdzv-endpoint %q: %s; want HOST, HOST:PORT, [IPv6] or [IPv6]:PORT", s, why)
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		// No port, or not host:port at all.
		host, port = s, strconv.Itoa(defaultRdzvPort)
		if inner, ok := strings.CutPrefix(s, "["); ok {
			if host, ok = strings.CutSuffix(inner, "]"); !ok {
				return refuse("no closing bracket")
			}
		} else if strings.Contains(s, ":") {
			return refuse("not HOST:PORT (an IPv6 address goes in brackets)")
		}
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return refuse(fmt.Sprintf("port %q is not a number 1 to 65535", port))
	}
	switch {
	case host == "":
		return refuse("no host")
	case strings.Contains(host, ":"):
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return refuse(fmt.Sprintf("%q is not an IPv6 address", host))
		}
	case !hostName.MatchString(host):
		return refuse(fmt.Sprintf("host %q is not a host name or an IP address", host))
	}
	return net.JoinHostPort(host, port), nil
}

func parseNNodes(s string) (minNodes, maxNodes int, err error) {
	lo, hi, found := strings.Cut(s, ":")
	if minNodes, err = strconv.Atoi(lo); err == nil {
		maxNodes = minNodes
		if found {
			maxNodes, err = strconv.Atoi(hi)
		}
	}
	if err != nil || minNodes < 1 || maxNodes < minNodes {
		return 0, 0, fmt.Errorf("--nnodes %q: want N or MIN:MAX with 1 ≤ MIN ≤ MAX", s)
	}
	return minNodes, maxNodes, nil
}

func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 65 {
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, fmt.Errorf("--dump-signal %q: unknown signal", s)
}
