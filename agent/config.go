package agent

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/kfelastic/kfelastic/agent/nodecheck"
	"github.com/kfelastic/kfelastic/internal/jobtoken"
)

// Config is the agent's configuration: torchrun's flags plus kfelastic's.
type Config struct {
	// Command is the worker command line (after "--").
	Command []string
	// NProcPerNode is the number of local workers.
	NProcPerNode int
	// MinNodes and MaxNodes are --nnodes MIN:MAX.
	MinNodes, MaxNodes int
	// MaxRestarts is the budget of restarts after worker failures.
	MaxRestarts int
	// NodeRank is the stable node rank; -1 when unknown.
	NodeRank int
	// RdzvBackend, RdzvEndpoint, RdzvID are torchrun's rendezvous settings.
	RdzvBackend, RdzvEndpoint, RdzvID string
	// MasterAddr and MasterPort are where the workers meet with the static
	// backend on several nodes (PET_MASTER_ADDR, PET_MASTER_PORT). For one
	// node, MasterAddr (default: the host's FQDN, as torchrun) is used with a
	// free port.
	MasterAddr string
	MasterPort int
	// LogDir holds <run id>_<random>/attempt_<n>/<local rank>/{stdout.log,
	// stderr.log,error.json}; a temporary folder when empty.
	LogDir string
	// ErrorPrefix is the URL where the pod's error document goes (file://,
	// s3://, mem://); when empty the document is only logged.
	ErrorPrefix string
	// Pod names the pod in documents and worker names.
	Pod string
	// HangTimeout > 0 turns on the hang watchdog.
	HangTimeout time.Duration
	// DumpSignal (0 = none) is sent to the workers on SIGTERM, then they get
	// DumpTimeout before the stop.
	DumpSignal  syscall.Signal
	DumpTimeout time.Duration
	// StopGrace is the time between SIGTERM and SIGKILL when stopping workers.
	StopGrace time.Duration
	// StorageTimeout bounds the agent's storage work: the upload of the
	// pod's error document, retried until it has passed (document.go), the
	// superseding at each group start, and each event write and the events'
	// drain at exit (eventlog.go). DefaultStorageTimeout when 0.
	StorageTimeout time.Duration
	// WarmSpares starts the next attempt's Python interpreters ahead, with
	// Preload (comma-separated modules, default "torch") imported, so that a
	// restart skips the interpreter start and imports (see spare.go). The
	// fork server imports Preload too.
	WarmSpares bool
	Preload    string
	// NoForkServer turns the fork server off (--fork-server=false): by
	// default, for a `python SCRIPT` or `python -m MODULE` command (and
	// without WarmSpares), the agent keeps one interpreter with Preload
	// imported and forks each worker from it, so that a restart skips the
	// interpreter start and the imports (agent/forkserver).
	NoForkServer bool
	// NoStoreProxy turns the store proxy off (--store-proxy=false): by
	// default the agent of group rank 0 listens on the round's MASTER_PORT
	// and forwards to the rank-0 worker's store on a private port, so that
	// no worker meets torch's one-second retry of a refused store connection
	// (agent/storeproxy). The visible difference from torchrun is global
	// rank 0's MASTER_PORT, which is that private port.
	NoStoreProxy bool
	// Launcher is who starts the workers (docs/DESIGN.md §4.4, --launcher): "agent"
	// ("" too), or "command", where the command starts its own through
	// torch elastic and the agent runs it once.
	Launcher string
	// Tee copies the workers' output, prefixed, to Stdout/Stderr (default true
	// in the command; torchrun's --tee).
	Tee bool

	// Rendezvous overrides the one chosen from the settings above (tests).
	Rendezvous Rendezvous
	// Stdout, Stderr receive the workers' tee and the rendezvous block;
	// os.Stdout/os.Stderr when nil. Run writes to them through a
	// nonblocking.Output, which never blocks (pass Outputs to share them
	// with the Logger).
	Stdout, Stderr io.Writer
	// Logger is the agent's own log; a text log on Stderr when nil. Its
	// writer should be a nonblocking.Output too, or never block.
	Logger *slog.Logger
	// Env is the base environment of the workers; os.Environ() when nil.
	Env []string
	// TokenFile holds the per-job token the master requires on every call
	// (docs/DESIGN.md §5.1); the plugin mounts it from the job's Secret.
	TokenFile string
	// HeartbeatInterval is the master heartbeat's period (default 5 s).
	HeartbeatInterval time.Duration

	// checkCommand replaces the Go node check's argv (tests).
	checkCommand []string
	// launcher, when set, starts the agent's workers instead of exec, the
	// fork server or warm spares (launch.go), and noGuardian runs the
	// agent without its guardian process: the tests that run the agent's
	// loop inside a testing/synctest bubble, where no process may run,
	// start in-process stand-ins of the workers (bubble_test.go).
	launcher   launcher
	noGuardian bool
}

// ErrMasterRequired is returned for an elastic multi-node job without a
// master to meet at.
var ErrMasterRequired = errors.New("an elastic multi-node job needs the kfelastic master: give --rdzv-endpoint HOST:PORT (and --token-file); or use --standalone, --nnodes 1, or --rdzv-backend static with --master-addr/--master-port and a fixed --nnodes")

// validate checks the configuration and fills in its defaults; it has no
// side effects beyond c (Run dials the master after it: rendezvous).
func (c *Config) validate() error {
	if len(c.Command) == 0 {
		return errors.New("no worker command (give it after --)")
	}
	if err := c.CheckRanges(); err != nil {
		return err
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 5 * time.Second
	}
	if c.StorageTimeout <= 0 {
		c.StorageTimeout = DefaultStorageTimeout
	}
	if c.Pod == "" {
		c.Pod, _ = os.Hostname()
	}
	// Names the agent sends the master and writes in the pod's document,
	// both protobuf, whose strings must be UTF-8: refused here, at once,
	// not found unsendable at the first join.
	if err := validUTF8("the pod name (_F_WN, FLYTE_INTERNAL_WORKER_NAME or POD_NAME, else the hostname)", c.Pod); err != nil {
		return err
	}
	if err := validUTF8("--master-addr", c.MasterAddr); err != nil {
		return err
	}
	if c.RdzvID == "" {
		c.RdzvID = "none" // torchrun's default --rdzv_id
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.command() {
		// Spares are interpreters for the agent's own workers; the command
		// forks its workers itself.
		c.WarmSpares = false
	}
	switch c.meeting() {
	case meetStatic:
		if c.MasterAddr == "" || c.MasterPort == 0 || c.NodeRank < 0 {
			return errors.New("--rdzv-backend static on several nodes needs --master-addr, --master-port and --node-rank")
		}
		if c.NodeRank >= c.MaxNodes {
			return fmt.Errorf("--node-rank %d: want 0 to %d with --nnodes %d", c.NodeRank, c.MaxNodes-1, c.MaxNodes)
		}
	case meetMaster:
		if c.RdzvEndpoint == "" {
			return ErrMasterRequired
		}
		if c.TokenFile == "" {
			return errors.New("the kfelastic master needs the job token: give --token-file")
		}
	}
	return nil
}

// meeting is how an agent meets the others (Config.meeting).
type meeting int

const (
	// meetGiven: Config.Rendezvous, set by the caller (tests).
	meetGiven meeting = iota
	// meetAlone: one node (--standalone, --nnodes 1), Single.
	meetAlone
	// meetStatic: torchrun's static backend on a fixed number of nodes,
	// Fixed.
	meetStatic
	// meetMaster: an elastic job on several nodes, through the kfelastic
	// master (Master).
	meetMaster
)

// meeting is how this agent meets the others, from its settings.
func (c *Config) meeting() meeting {
	switch {
	case c.Rendezvous != nil:
		return meetGiven
	case c.MaxNodes == 1:
		return meetAlone
	case c.RdzvBackend == "static" && c.MinNodes == c.MaxNodes:
		return meetStatic
	}
	return meetMaster
}

// rendezvous is the Rendezvous a validated configuration meets the others
// through; with the master it reads the job's token and dials the master
// (lazily: it connects on the first call), and closeIt closes what it
// dialled; a no-op otherwise.
func (c *Config) rendezvous() (r Rendezvous, closeIt func(), err error) {
	switch c.meeting() {
	case meetGiven:
		return c.Rendezvous, func() {}, nil
	case meetAlone:
		return &Single{RunID: c.RdzvID}, func() {}, nil
	case meetStatic:
		return &Fixed{RunID: c.RdzvID, Nodes: c.MaxNodes, MasterAddr: c.MasterAddr, MasterPort: c.MasterPort}, func() {}, nil
	}
	token, err := jobtoken.Read(c.TokenFile)
	if err != nil {
		return nil, nil, fmt.Errorf("--token-file: %w", err)
	}
	host := nodeHost()
	if err := validUTF8("the node name ("+nodeNameEnv+", else the hostname)", host); err != nil {
		return nil, nil, err
	}
	m, err := DialMaster(MasterConfig{Endpoint: c.RdzvEndpoint, Token: token, Host: host, Logger: c.Logger,
		HeartbeatInterval: c.HeartbeatInterval,
		Check:             &nodecheck.Checker{Python: InterpreterOf(c.Command), Env: c.Env, Logger: c.Logger, GoCheck: c.checkCommand}})
	if err != nil {
		return nil, nil, err
	}
	return m, func() { _ = m.Close() }, nil
}

// nodeNameEnv is kfoperator.NodeNameEnv: the plugin sets it to the pod's
// spec.nodeName.
const nodeNameEnv = "KFELASTIC_NODE_NAME"

// nodeHost is the machine the pod runs on, as the master should avoid it:
// nodeNameEnv, else the hostname.
func nodeHost() string {
	if h := os.Getenv(nodeNameEnv); h != "" {
		return h
	}
	h, _ := os.Hostname()
	return h
}

// validUTF8 refuses a name that is not valid UTF-8, saying what it is and
// where it comes from (what).
func validUTF8(what, name string) error {
	if utf8.ValidString(name) {
		return nil
	}
	return fmt.Errorf("%s %q is not valid UTF-8: the master's protocol and the pod's error document carry only UTF-8 names", what, name)
}

// Ranges of the agent's numbers, as `kfelastic agent --help` states them.
const (
	// MaxNProcPerNode bounds the local workers: more GPUs or cores than any
	// node has, while a typo (100000) is refused before it starts that
	// many processes (1.4 GB and a minute of the agent's time).
	MaxNProcPerNode = 1024
	// maxSignal is SIGRTMAX on Linux.
	maxSignal = 64
)

// CheckRanges refuses numbers the agent cannot honour, naming the flag they
// come from: a negative duration, a port beyond 65535, a dump signal no
// worker can catch. Run checks them first; the command too, as soon as its
// flags are parsed. The zero durations of StopGrace and StorageTimeout are
// their defaults; the command refuses 0 for them itself.
func (c *Config) CheckRanges() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"hang-timeout", c.HangTimeout}, {"dump-timeout", c.DumpTimeout}, {"stop-grace", c.StopGrace}, {"storage-timeout", c.StorageTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("--%s %v: want ≥ 0", d.flag, d.v)
		}
	}
	switch {
	case c.NProcPerNode < 1 || c.NProcPerNode > MaxNProcPerNode:
		return fmt.Errorf("--nproc-per-node %d: want 1 to %d", c.NProcPerNode, MaxNProcPerNode)
	case c.MinNodes < 1 || c.MaxNodes < c.MinNodes:
		return fmt.Errorf("--nnodes %d:%d: want 1 ≤ MIN ≤ MAX", c.MinNodes, c.MaxNodes)
	case c.MaxRestarts < 0:
		return fmt.Errorf("--max-restarts %d: want ≥ 0", c.MaxRestarts)
	case c.NodeRank < -1:
		return fmt.Errorf("--node-rank %d: want ≥ 0, or -1 for the rendezvous to assign it", c.NodeRank)
	case c.MasterPort < 0 || c.MasterPort > 65535:
		return fmt.Errorf("--master-port %d: want 1 to 65535 (0: none)", c.MasterPort)
	case c.DumpSignal < 0 || c.DumpSignal > maxSignal:
		return fmt.Errorf("--dump-signal %d: want a signal 1 to %d", int(c.DumpSignal), maxSignal)
	case c.DumpSignal == syscall.SIGKILL || c.DumpSignal == syscall.SIGSTOP:
		return fmt.Errorf("--dump-signal %s: a worker cannot catch it to checkpoint; use one it can (SIGUSR1)", c.DumpSignal)
	}
	return nil
}

// preload is what a fork server, the spares and the command's spawn hook
// import ahead: Preload, torch when unset.
func (c *Config) preload() string {
	if c.Preload == "" {
		return "torch"
	}
	return c.Preload
}
