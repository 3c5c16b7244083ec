package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/agent/nodecheck"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/mastertest"
	"github.com/kfelastic/kfelastic/master"
)

// startMaster runs a real master on loopback for the test and returns its
// endpoint and token file.
func startMaster(t *testing.T, cfg master.Config) (endpoint, tokenFile string) {
	t.Helper()
	m := mastertest.Start(t, cfg, "")
	return m.Addr, m.TokenFile
}

// The agent refuses a job token it cannot read, and an elastic job without
// a master, with clear errors before any worker starts.
func TestMasterNeedsTokenAndEndpoint(t *testing.T) {
	cfg, _ := helperConfig(t, 1, "ok")
	cfg.MinNodes, cfg.MaxNodes, cfg.RdzvBackend = 1, 2, "c10d"
	if err := Run(t.Context(), cfg); !errors.Is(err, ErrMasterRequired) {
		t.Errorf("no endpoint: %v", err)
	}
	cfg.RdzvEndpoint = "127.0.0.1:1"
	if err := Run(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Errorf("no token file: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "token")
	_ = os.WriteFile(empty, []byte("\n"), 0o600)
	cfg.TokenFile = empty
	if err := Run(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty token: %v", err)
	}
}

// A node the master's health check finds faulty exits with a
// NodeCheckFailed document and the code the operator restarts (its pod is
// relaunched elsewhere); its partner, which failed only the first round,
// trains. The faulty node's check process is killed, as a broken machine
// (or the local engine's break-check) would.
func TestNodeCheckExcludesFaultyNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agents, checks and workers")
	}
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 2, MaxNodes: 3, NetworkCheck: true,
		WaitingTimeout: 300 * time.Millisecond, CheckTimeout: 4 * time.Second})
	prefix := "file://" + t.TempDir()
	type res struct {
		ee  *ExitError
		err error
		out *syncBuffer
	}
	results := make([]chan res, 3)
	for i := range 3 {
		cfg, out := helperConfig(t, 1, "ok")
		cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = fmt.Sprintf("job-worker-%d", i), i, 2, 3
		cfg.RdzvBackend, cfg.RdzvEndpoint, cfg.TokenFile, cfg.ErrorPrefix = "c10d", endpoint, tokenFile, prefix
		results[i] = make(chan res, 1)
		mode := "ok"
		if i == 1 {
			mode = "killself"
		}
		cfg.checkCommand = []string{os.Args[0], "-test.run=^$"}
		cfg.Env = append(cfg.Env, nodeCheckHelperEnv+"="+mode)
		go func() {
			err := Run(t.Context(), cfg)
			var ee *ExitError
			errors.As(err, &ee)
			results[i] <- res{ee, err, out}
		}()
	}
	for i, ch := range results {
		var r res
		select {
		case r = <-ch:
		case <-time.After(3 * time.Minute):
			// A wrong verdict leaves the others waiting for a round:
			// fail here, not at the package's timeout.
			t.Fatalf("node %d still running after 3 minutes", i)
		}
		switch i {
		case 1:
			if r.ee == nil || r.ee.Failure.Code != kferrors.CodeNodeCheckFailed || r.ee.Code != kferrors.ExitNodeCheckFailed {
				t.Errorf("faulty node: %v, want NodeCheckFailed with exit %d\n%s", r.err, kferrors.ExitNodeCheckFailed, r.out)
			}
			if r.ee != nil && !strings.Contains(r.ee.Failure.Message, "killed by SIGKILL") {
				t.Errorf("faulty node's message: %s", r.ee.Failure.Message)
			}
		default:
			if r.err != nil {
				t.Errorf("healthy node %d: %v\n%s", i, r.err, r.out)
			}
			if !strings.Contains(r.out.String(), "group_world_size=2") {
				t.Errorf("node %d did not train in a round of 2:\n%s", i, r.out)
			}
		}
	}
}

// nodeCheckHelperEnv makes the test binary a Go check process: "ok" runs
// nodecheck.GoMain; "killself" is killed by SIGKILL mid-check.
const nodeCheckHelperEnv = "KFELASTIC_TEST_NODE_CHECK"

func init() {
	if mode, ok := os.LookupEnv(nodeCheckHelperEnv); ok && os.Getenv(nodecheck.MarkEnv) == "1" {
		// The args after the test flags are the check's.
		args := os.Args[1:]
		for len(args) > 0 && strings.HasPrefix(args[0], "-test.") {
			args = args[1:]
		}
		if mode == "killself" {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		if mode == "slow" {
			args = append(args, "--work", "150")
		}
		os.Exit(nodecheck.GoMain(args, os.Stdout, os.Stderr))
	}
}

// freeAddr is a loopback address nothing listens on, for a master that
// stops and comes back at the same address.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// serveMasterAt serves a master with opts at addr (waiting for the port
// the master before it held to free) until stop; its log is discarded.
func serveMasterAt(t *testing.T, addr string, opts master.Options) (s *master.Server, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := master.NewServer(ctx, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var lis net.Listener
	for i := 0; ; i++ {
		if lis, err = net.Listen("tcp", addr); err == nil || i > 100 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, lis) }()
	return s, func() { cancel(); <-done }
}

// A master that refuses a running node for good ends it in seconds, as a
// refused join does: the workers stopped, the pod's document, the exit
// code for its kind. It used to retry the refused heartbeat for as long as
// the workers ran, the node lost to the master and its workers
// unsupervised. The address is served again by another job's master, with
// another job token (and a state of its own: a master refuses a state
// written under another token) (AuthenticationFailed, NON_RECOVERABLE,
// exit 1; under both launchers, whose stops differ), or by a master
// without the state the node joined
// (NotFound on its heartbeat: ended as a refused join, RendezvousTimeout,
// exit 202, so that a relaunched pod joins afresh), or by a master with
// fewer nodes than the node's rank (InvalidArgument: NodeRefused,
// NON_RECOVERABLE, exit 1: the pod would describe itself the same way after
// a restart). Real master, real agents, helper workers.
func TestHeartbeatRefusedEndsAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a master under running agents")
	}
	for _, c := range []struct {
		name        string
		launcher    string // "": the agent's own workers
		token       string // of the master that comes back
		newState    bool   // it comes back on an empty state
		code        string
		exit        int
		recoverable bool
		mode        string // the helper's; "": hang
		maxNodes    int    // the --nnodes max that the master comes back with; 0: the same (2)
		rank        int
	}{
		{"token", "", "another-jobs-token", true, kferrors.CodeAuthenticationFailed, 1, false, "", 0, 0},
		{"token-command", LauncherCommand, "another-jobs-token", true, kferrors.CodeAuthenticationFailed, 1, false, "", 0, 0},
		// The command's store calls, through the relay, meet the refusal
		// before the heartbeat does: the pod's document is still the
		// refusal, not the command's failure that the refusal caused.
		{"token-command-store", LauncherCommand, "another-jobs-token", true, kferrors.CodeAuthenticationFailed, 1, false, "storepoll", 0, 0},
		{"state-lost", "", mastertest.Token, true, kferrors.CodeRendezvousTimeout, kferrors.ExitRendezvousTimeout, true, "", 0, 0},
		// The master came back with fewer nodes than this node's rank
		// (InvalidArgument): NodeRefused, exit 1, not a restart that the
		// master would refuse again.
		{"rank-outside", "", mastertest.Token, true, kferrors.CodeNodeRefused, 1, false, "", 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := freeAddr(t)
			job := master.Config{JobID: "test", MinNodes: 1, MaxNodes: 2, WaitingTimeout: 100 * time.Millisecond,
				HeartbeatTimeout: time.Minute}
			opts := master.Options{Token: mastertest.Token, Job: job, StateURL: "file://" + t.TempDir(),
				HeartbeatInterval: 200 * time.Millisecond}
			_, stop := serveMasterAt(t, addr, opts)
			tokenFile := filepath.Join(t.TempDir(), "token")
			_ = os.WriteFile(tokenFile, []byte(mastertest.Token), 0o600)
			mode, ready := "hang", "[default0]:helper hang"
			if c.mode != "" {
				mode, ready = c.mode, "helper storepoll connected"
			}
			cfg, out := helperConfig(t, 1, mode)
			dir := t.TempDir()
			cfg.Launcher, cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = c.launcher, fmt.Sprintf("job-worker-%d", c.rank), c.rank, 1, 2
			cfg.RdzvBackend, cfg.RdzvEndpoint, cfg.TokenFile = "c10d", addr, tokenFile
			cfg.HeartbeatInterval, cfg.ErrorPrefix = 200*time.Millisecond, "file://"+dir
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			waitFor(t, out, ready, 10*time.Second)
			stop()
			opts.Token = c.token
			if c.maxNodes != 0 {
				opts.Job.MaxNodes = c.maxNodes
			}
			if c.newState {
				opts.StateURL = "file://" + t.TempDir()
			}
			_, stop = serveMasterAt(t, addr, opts)
			defer stop()
			back := time.Now()
			var err error
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("the agent still runs 20 s after the master came back refusing it:\n%s", out)
			}
			took := time.Since(back)
			var ee *ExitError
			if !errors.As(err, &ee) || ee.Failure.Code != c.code || ee.Code != c.exit || ee.Failure.Recoverable != c.recoverable {
				t.Fatalf("want %s (recoverable %v), exit %d; got %v\n%s", c.code, c.recoverable, c.exit, err, out)
			}
			if got := readDocument(t, dir, ee.Document); got.Code != c.code || got.Recoverable != c.recoverable {
				t.Errorf("document %+v", got)
			}
			if !strings.Contains(out.String(), "the master refuses this node for good") {
				t.Errorf("no word of the refusal:\n%s", out)
			}
			t.Logf("%s, exit %d, %v after the master came back: %s", ee.Failure.Code, ee.Code, took.Round(time.Millisecond),
				ee.Failure.Message)
		})
	}
}

// A master that stops and comes back (same state, same address) is a pause
// for the agents, not an error: they keep training in their round, their
// heartbeats retry until it is back, and no new round is formed.
func TestAgentsRideOutAMasterRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a master under running agents")
	}
	state := "file://" + t.TempDir()
	addr := freeAddr(t)
	cfg := master.Config{JobID: "test", MinNodes: 2, MaxNodes: 2, HeartbeatTimeout: 20 * time.Second}
	serve := func() (*master.Server, func()) {
		return serveMasterAt(t, addr, master.Options{Token: mastertest.Token, Job: cfg, StateURL: state,
			HeartbeatInterval: 300 * time.Millisecond})
	}
	_, stop := serve()
	tokenFile := filepath.Join(t.TempDir(), "token")
	_ = os.WriteFile(tokenFile, []byte(mastertest.Token), 0o600)
	type res struct {
		err error
		out *syncBuffer
	}
	results := make([]chan res, 2)
	outs := make([]*syncBuffer, 2)
	for i := range 2 {
		c, out := helperConfig(t, 1, "touch:4s")
		outs[i] = out
		c.Pod, c.NodeRank, c.MinNodes, c.MaxNodes = fmt.Sprintf("job-worker-%d", i), i, 2, 2
		c.RdzvBackend, c.RdzvEndpoint, c.TokenFile, c.HeartbeatInterval = "c10d", addr, tokenFile, 300*time.Millisecond
		results[i] = make(chan res, 1)
		go func() { results[i] <- res{Run(t.Context(), c), out} }()
	}
	// Once training runs, the master goes away for a second and comes back.
	for _, out := range outs {
		waitFor(t, out, "Rendezvous complete for workers", 10*time.Second)
	}
	time.Sleep(500 * time.Millisecond)
	stop()
	time.Sleep(time.Second)
	s, stop2 := serve()
	defer stop2()
	for i, ch := range results {
		r := <-ch
		if r.err != nil {
			t.Errorf("agent %d: %v\n%s", i, r.err, r.out)
		}
		if n := strings.Count(r.out.String(), "Rendezvous complete for workers"); n != 1 {
			t.Errorf("agent %d went through %d rounds, want 1 (no new round after the master's restart):\n%s", i, n, r.out)
		}
	}
	st, err := s.Status(t.Context())
	if err != nil || st.GetRound() != 1 {
		t.Errorf("after the restart: round %d, %v", st.GetRound(), err)
	}
}

// A replacement pod that joins while the pod it replaces still holds the
// rank (issue 17: on Kubernetes the operator creates it at once, before
// the master learns of the deletion) waits for the rank, takes it over
// when the old pod leaves, trains, and writes no document. With the old
// pod alive past the pend timeout it exits 1 with a RankHeld document.
// A real master, real agents, helper workers.
func TestEarlyReplacementWaitsForItsRank(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a master and agents")
	}
	for _, preempted := range []bool{true, false} {
		t.Run(map[bool]string{true: "old pod leaves", false: "old pod stays"}[preempted], func(t *testing.T) {
			endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 1, MaxNodes: 2,
				WaitingTimeout: 200 * time.Millisecond, PendTimeout: 3 * time.Second})
			dir := t.TempDir()
			node := func(pod, modes string) (Config, *syncBuffer, chan error) {
				cfg, out := helperConfig(t, 1, modes)
				cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = pod, 0, 1, 2
				cfg.RdzvBackend, cfg.RdzvEndpoint, cfg.TokenFile, cfg.ErrorPrefix = "c10d", endpoint, tokenFile, "file://"+dir
				return cfg, out, make(chan error, 1)
			}
			oldCtx, preempt := context.WithCancel(t.Context())
			defer preempt()
			a, aout, aDone := node("job-worker-0", "hang")
			go func() { aDone <- Run(oldCtx, a) }()
			waitFor(t, aout, "Rendezvous complete for workers", 10*time.Second)
			b, bout, bDone := node("job-worker-3", "ok")
			start := time.Now()
			go func() { bDone <- Run(t.Context(), b) }()
			time.Sleep(time.Second)
			select {
			case err := <-bDone:
				t.Fatalf("the replacement ended while the old pod held its rank: %v\n%s", err, bout)
			default:
			}
			if !preempted {
				err := <-bDone
				var ee *ExitError
				if !errors.As(err, &ee) || ee.Failure.Code != kferrors.CodeRankHeld || ee.Code != 1 {
					t.Fatalf("replacement past the pend timeout: %v, want RankHeld, exit 1\n%s", err, bout)
				}
				if took := time.Since(start); took < 2500*time.Millisecond {
					t.Errorf("gave up after %s, before the pend timeout (3s)", took)
				}
				if docs, _ := filepath.Glob(filepath.Join(dir, "error-*job-worker-3*.pb")); len(docs) != 1 {
					t.Errorf("documents of the replacement: %v, want its RankHeld one", docs)
				}
				preempt()
				<-aDone
				return
			}
			preempt()
			var ee *ExitError
			if err := <-aDone; !errors.As(err, &ee) || ee.Failure.Code != kferrors.CodePreempted {
				t.Errorf("old pod: %v, want Preempted\n%s", err, aout)
			}
			if err := <-bDone; err != nil {
				t.Fatalf("replacement: %v, want success\n%s", err, bout)
			}
			if !strings.Contains(bout.String(), "Rendezvous complete for workers") || !strings.Contains(bout.String(), "helper ok") {
				t.Errorf("the replacement did not train:\n%s", bout)
			}
			if docs, _ := filepath.Glob(filepath.Join(dir, "error-*job-worker-3*.pb")); len(docs) != 0 {
				t.Errorf("the replacement wrote documents though nothing failed: %v", docs)
			}
		})
	}
}

// A join the master refuses outright (every rank held by a live pod, the
// pod asking the master to choose one) ends the pod at once with a RankHeld
// document and exit 1, not a RendezvousTimeout (202) that nothing timed.
func TestJoinRefusedIsRankHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a master and agents")
	}
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 1, MaxNodes: 2, WaitingTimeout: 200 * time.Millisecond})
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var outs []*syncBuffer
	var dones []chan error
	for i, pod := range []string{"job-worker-0", "job-worker-1", "job-worker-2"} {
		cfg, out := helperConfig(t, 1, "hang")
		cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = pod, i, 1, 2
		if i == 2 {
			cfg.NodeRank = -1
		}
		cfg.RdzvBackend, cfg.RdzvEndpoint, cfg.TokenFile, cfg.ErrorPrefix = "c10d", endpoint, tokenFile, "file://"+dir
		done := make(chan error, 1)
		outs, dones = append(outs, out), append(dones, done)
		if i == 2 {
			for _, o := range outs[:2] {
				waitFor(t, o, "helper hang", 10*time.Second)
			}
		}
		go func() { done <- Run(ctx, cfg) }()
	}
	select {
	case err := <-dones[2]:
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Failure.Code != kferrors.CodeRankHeld || ee.Code != 1 {
			t.Fatalf("third pod: %v, want RankHeld, exit 1\n%s", err, outs[2])
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the refused pod waits:\n%s", outs[2])
	}
	cancel()
	for _, d := range dones[:2] {
		<-d
	}
}

// A join that the master refuses for the node's own description (its rank
// outside the master's --nnodes: the pod's and the master's configurations
// disagree) ends the pod with NodeRefused, NON_RECOVERABLE, exit 1 and no
// worker started. It used to end as a RendezvousTimeout, exit 202, which
// the training operator's ExitCode policy restarts, into the same refusal,
// without end. A real master.
func TestJoinRefusedForNodeDescription(t *testing.T) {
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 1, MaxNodes: 2})
	cfg, out := helperConfig(t, 1, "ok")
	dir := t.TempDir()
	cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = "job-worker-3", 3, 1, 4
	cfg.RdzvBackend, cfg.RdzvEndpoint, cfg.TokenFile, cfg.ErrorPrefix = "c10d", endpoint, tokenFile, "file://"+dir
	ee, took := runAgent(t, t.Context(), cfg)
	if ee == nil || ee.Failure.Code != kferrors.CodeNodeRefused || ee.Code != 1 || ee.Failure.Recoverable {
		t.Fatalf("want NodeRefused, NON_RECOVERABLE, exit 1; got %v\n%s", ee, out)
	}
	if got := readDocument(t, dir, ee.Document); got.Code != kferrors.CodeNodeRefused || got.Recoverable ||
		!strings.Contains(got.Message, "node rank 3 outside [0, 2)") {
		t.Errorf("document %+v", got)
	}
	if strings.Contains(out.String(), "helper ok") {
		t.Errorf("a worker started:\n%s", out)
	}
	t.Logf("%s, exit %d, in %v: %s", ee.Failure.Code, ee.Code, took.Round(time.Millisecond), ee.Failure.Message)
}

// A pod or node name that is not UTF-8 cannot be sent to the master
// (protobuf's strings must be UTF-8) nor written in the pod's document:
// the agent refuses it at start, naming where it comes from. It used to
// join, find the Join unsendable, and retry it as an unreachable master
// for 10 minutes.
func TestNonUTF8NamesRefusedAtStart(t *testing.T) {
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 1, MaxNodes: 2})
	for _, c := range []struct {
		pod, nodeName, want string
	}{
		{"job-worker-\xff", "", "pod name"},
		{"job-worker-0", "node-\xfe", "KFELASTIC_NODE_NAME"},
	} {
		t.Setenv("KFELASTIC_NODE_NAME", c.nodeName)
		cfg, out := helperConfig(t, 1, "ok")
		cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = c.pod, 0, 1, 2
		cfg.RdzvBackend, cfg.RdzvEndpoint, cfg.TokenFile = "c10d", endpoint, tokenFile
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
		start := time.Now()
		err := Run(ctx, cfg)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "not valid UTF-8") ||
			time.Since(start) > 5*time.Second {
			t.Errorf("pod %q, node %q: %v after %v, want a refusal naming %s at once\n%s", c.pod, c.nodeName, err,
				time.Since(start).Round(time.Millisecond), c.want, out)
		}
	}
}

// A join that gRPC cannot encode (a name the start did not check: the
// node's address, from DNS) is no unreachable master: it ends the pod at
// once with NodeRefused, NON_RECOVERABLE, as the master's own refusal of
// the node's description does.
func TestUnsendableJoinIsNodeRefused(t *testing.T) {
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 1, MaxNodes: 2})
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	m, err := DialMaster(MasterConfig{Endpoint: endpoint, Token: strings.TrimSpace(string(token)), Host: "node-0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	start := time.Now()
	_, err = m.Next(ctx, NodeInfo{ID: "job-worker-0", Rank: 0, LocalWorldSize: 1, Addr: "host-\xff.example", Port: 1})
	var ex *ExcludedError
	if !errors.As(err, &ex) || ex.Code != kferrors.CodeNodeRefused || !ex.Permanent || !strings.Contains(ex.Message, "UTF-8") ||
		time.Since(start) > 5*time.Second {
		t.Errorf("join with an address that is not UTF-8: %v after %v, want NodeRefused at once", err, time.Since(start).Round(time.Millisecond))
	}
}
