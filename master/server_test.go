package master_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/internal/test/mastertest"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master"
)

const token = mastertest.Token

// masterCommand is a master process (the test binary, TestMain) serving
// addr on state, for rounds of min..max nodes, started unless start is
// false; it dies with the test.
func masterCommand(t *testing.T, addr, state string, min, max int, start bool) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KFELASTIC_TEST_MASTER="+addr, "KFELASTIC_TEST_STATE="+state,
		"KFELASTIC_TEST_MIN="+strconv.Itoa(min), "KFELASTIC_TEST_MAX="+strconv.Itoa(max))
	cmd.Stderr = &prefixWriter{t: t, prefix: "master: "}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if start {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	return cmd
}

// TestMain lets the test binary be a master process (KFELASTIC_TEST_MASTER
// set), so that a test can SIGKILL and restart it.
func TestMain(m *testing.M) {
	if addr := os.Getenv("KFELASTIC_TEST_MASTER"); addr != "" {
		os.Exit(runMasterProcess(addr))
	}
	testenv.Main(m) // stops the MinIO a test started
}

func runMasterProcess(addr string) int {
	min, _ := strconv.Atoi(os.Getenv("KFELASTIC_TEST_MIN"))
	max, _ := strconv.Atoi(os.Getenv("KFELASTIC_TEST_MAX"))
	opts := master.Options{Token: token, StateURL: os.Getenv("KFELASTIC_TEST_STATE"),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)), HeartbeatInterval: time.Second,
		Job: master.Config{JobID: "restart", MinNodes: min, MaxNodes: max, WaitingTimeout: time.Second, HeartbeatTimeout: 10 * time.Second}}
	ctx := context.Background()
	s, err := master.NewServer(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "master:", err)
		return 2
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "master:", err)
		return 2
	}
	fmt.Println("serving")
	if err := s.Serve(ctx, lis); err != nil {
		fmt.Fprintln(os.Stderr, "master:", err)
		return 1
	}
	return 0
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

func dial(t testing.TB, addr, tok string) masterpb.MasterClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(tok)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return masterpb.NewMasterClient(conn)
}

// startServer runs a master in this process on loopback.
func startServer(t testing.TB, cfg master.Config, state string) (string, *master.Server) {
	t.Helper()
	if state == "" {
		state = "mem://"
	}
	m := mastertest.Start(t, cfg, state)
	return m.Addr, m.Server
}

func node(i int) *masterpb.Node {
	return &masterpb.Node{Pod: fmt.Sprintf("job-worker-%d", i), Incarnation: "1", Rank: int32(i), LocalWorldSize: 2,
		Addr: fmt.Sprintf("10.0.%d.%d", i/250, i%250), Port: 29500, Host: fmt.Sprintf("node-%d", i)}
}

// join long-polls until the node gets a round.
func join(ctx context.Context, c masterpb.MasterClient, n *masterpb.Node, after int64) (*masterpb.Round, error) {
	for {
		res, err := c.Join(ctx, &masterpb.JoinRequest{Node: n, AfterRound: after, WaitMs: 10000})
		if err != nil {
			return nil, err
		}
		switch o := res.GetOutcome().(type) {
		case *masterpb.JoinResponse_Round:
			return o.Round, nil
		case *masterpb.JoinResponse_Excluded:
			return nil, fmt.Errorf("excluded: %v", o.Excluded)
		case *masterpb.JoinResponse_Check:
			return nil, errors.New("unexpected check")
		}
	}
}

// joinAll joins nodes 0..n-1 at once, each until it gets its round.
func joinAll(t *testing.T, c masterpb.MasterClient, n int) []*masterpb.Round {
	t.Helper()
	rounds := make([]*masterpb.Round, n)
	var g errgroup.Group
	for i := range n {
		g.Go(func() (err error) { rounds[i], err = join(t.Context(), c, node(i), 0); return err })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	return rounds
}

// Every call without the job's token, or with another, is refused, and
// the refusal says nothing about the job.
func TestWrongTokenRefused(t *testing.T) {
	addr, _ := startServer(t, master.Config{JobID: "secret-job-name", MinNodes: 1, MaxNodes: 2}, "")
	for name, tok := range map[string]string{"no token": "", "wrong token": "guess", "prefix": token[:4]} {
		c := dial(t, addr, tok)
		_, err := c.Status(t.Context(), &masterpb.StatusRequest{})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: Status: %v, want Unauthenticated", name, err)
		}
		if strings.Contains(err.Error(), "secret-job-name") {
			t.Errorf("%s: the refusal names the job: %v", name, err)
		}
		_, err = c.Join(t.Context(), &masterpb.JoinRequest{Node: node(0)})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: Join: %v, want Unauthenticated", name, err)
		}
	}
	if st, err := dial(t, addr, token).Status(t.Context(), &masterpb.StatusRequest{}); err != nil || st.GetJob() != "secret-job-name" {
		t.Errorf("with the token: %v %v", st, err)
	}
}

// Malformed requests get clear errors and change nothing.
func TestBadRequests(t *testing.T) {
	addr, _ := startServer(t, master.Config{JobID: "j", MinNodes: 2, MaxNodes: 2}, "")
	c := dial(t, addr, token)
	ctx := t.Context()
	huge := strings.Repeat("x", 300)
	for name, req := range map[string]*masterpb.JoinRequest{
		"no node":       {},
		"rank too big":  {Node: &masterpb.Node{Pod: "p", Incarnation: "1", Rank: 9, LocalWorldSize: 1}},
		"no pod":        {Node: &masterpb.Node{Incarnation: "1", Rank: 0, LocalWorldSize: 1}},
		"huge pod name": {Node: &masterpb.Node{Pod: huge, Incarnation: "1", Rank: 0, LocalWorldSize: 1}},
		"no workers":    {Node: &masterpb.Node{Pod: "p", Incarnation: "1", Rank: 0}},
		"bad port":      {Node: &masterpb.Node{Pod: "p", Incarnation: "1", Rank: 0, LocalWorldSize: 1, Port: 70000}},
		"negative":      {Node: &masterpb.Node{Pod: "p", Incarnation: "1", Rank: 0, LocalWorldSize: 1}, AfterRound: -1},
	} {
		if _, err := c.Join(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	// A second pod for a live pod's rank waits for the rank to free (a
	// replacement that came early); it does not get it.
	if _, err := c.Join(ctx, &masterpb.JoinRequest{Node: node(0)}); err != nil {
		t.Fatal(err)
	}
	evil := node(0)
	evil.Pod = "intruder"
	if res, err := c.Join(ctx, &masterpb.JoinRequest{Node: evil}); err != nil || res.GetPending() == nil {
		t.Errorf("claiming rank 0: %v %v, want pending", res, err)
	}
	// A heartbeat from nobody, a leave without a failure.
	if _, err := c.Heartbeat(ctx, &masterpb.HeartbeatRequest{Node: node(1)}); status.Code(err) != codes.NotFound {
		t.Errorf("heartbeat of an unknown node: %v", err)
	}
	if _, err := c.Leave(ctx, &masterpb.LeaveRequest{Node: node(0)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("leave without failure: %v", err)
	}
	// Store: an empty op, a replayed seq, a value over the limit.
	if _, err := c.Store(ctx, &masterpb.StoreRequest{Client: "c"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty store op: %v", err)
	}
	set := func(seq uint64, v string) error {
		_, err := c.Store(ctx, &masterpb.StoreRequest{Client: "c", Seq: seq, Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: "k", Value: []byte(v)}}})
		return err
	}
	if err := set(5, "a"); err != nil {
		t.Fatal(err)
	}
	if err := set(3, "b"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("replayed seq: %v", err)
	}
	st, err := c.Status(ctx, &masterpb.StatusRequest{})
	if err != nil || len(st.GetNodes()) != 1 || st.GetNodes()[0].GetPod() != "job-worker-0" {
		t.Errorf("state after bad requests: %v %v", st, err)
	}
}

// 1,000 simulated agents over real gRPC on loopback complete one round;
// each learns a distinct group rank and the same world.
func TestThousandAgentsRendezvous(t *testing.T) {
	const n = 1000
	addr, _ := startServer(t, master.Config{JobID: "big", MinNodes: n, MaxNodes: n}, "file://"+t.TempDir())
	// Agents share 20 connections: one process cannot hold 1,000 of them
	// comfortably, and the server sees 1,000 concurrent calls either way.
	clients := make([]masterpb.MasterClient, 20)
	for i := range clients {
		clients[i] = dial(t, addr, token)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	start := time.Now()
	rounds := make([]*masterpb.Round, n)
	var g errgroup.Group
	for i := range n {
		g.Go(func() error {
			r, err := join(ctx, clients[i%len(clients)], node(i), 0)
			rounds[i] = r
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("1,000 agents: round complete in %v", time.Since(start))
	seen := map[int32]bool{}
	for i, r := range rounds {
		if r.GetNumber() != 1 || r.GetGroupWorldSize() != n || r.GetWorldSize() != 2*n || r.GetFirstGlobalRank() != 2*r.GetGroupRank() ||
			r.GetMasterAddr() != "10.0.0.0" {
			t.Fatalf("agent %d: %v", i, r)
		}
		seen[r.GetGroupRank()] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct group ranks", len(seen))
	}
}

// The heartbeat long poll brings control actions at once: a third node
// joins, the two running members are told to restart (scale up) within
// milliseconds, not at their next interval.
func TestHeartbeatCarriesRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startInBubble(t, master.Options{StateURL: "mem://",
			Job: master.Config{JobID: "hb", MinNodes: 2, MaxNodes: 3, WaitingTimeout: 200 * time.Millisecond}})
		c := m.client(t, token)
		ctx := t.Context()
		joinAll(t, c, 2)
		got := make(chan time.Time, 1)
		go func() {
			res, err := c.Heartbeat(ctx, &masterpb.HeartbeatRequest{Node: node(0), Round: 1, WaitMs: 20000})
			if err == nil && res.GetAction() == masterpb.HeartbeatResponse_RESTART {
				got <- time.Now()
			}
		}()
		synctest.Wait() // the master holds the heartbeat
		joined := time.Now()
		go func() { _, _ = join(ctx, c, node(2), 0) }()
		select {
		case at := <-got:
			if d := at.Sub(joined); d != 0 {
				t.Errorf("restart reached the member %v after the join, want at once", d)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no restart on the heartbeat after a node joined")
		}
	})
}

// A node waiting for a round that cannot form yet is held at most half the
// heartbeat timeout per call, and, calling again, is never declared lost
// while it waits (it was, when a Join was held for the agent's 30 s).
func TestWaitingNodeNotLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startInBubble(t, master.Options{StateURL: "mem://",
			Job: master.Config{JobID: "wait", MinNodes: 2, MaxNodes: 2, HeartbeatTimeout: 600 * time.Millisecond}})
		c := m.client(t, token)
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		for {
			start := time.Now()
			res, err := c.Join(ctx, &masterpb.JoinRequest{Node: node(0), WaitMs: 30000})
			if ctx.Err() != nil {
				break
			}
			// The call's deadline travels as grpc-timeout, truncated to
			// whole microseconds: the server's copy can expire just
			// before the client's.
			if deadline, _ := ctx.Deadline(); status.Code(err) == codes.DeadlineExceeded && time.Until(deadline) < time.Millisecond {
				break
			}
			if err != nil {
				t.Fatalf("join: %v", err)
			}
			if d := time.Since(start); d > 300*time.Millisecond {
				t.Fatalf("a join was held %v, beyond half the heartbeat timeout", d)
			}
			if res.GetRound() != nil || res.GetExcluded() != nil {
				t.Fatalf("a lone node of 2:2 got %v", res)
			}
		}
		st, err := c.Status(t.Context(), &masterpb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.GetDecisions()) != 0 {
			t.Errorf("the waiting node was declared lost: %v", st.GetDecisions())
		}
	})
}

// The store over gRPC: WAIT blocks until a key exists or its timeout;
// retried mutations apply once.
func TestStoreOverGRPC(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startInBubble(t, master.Options{StateURL: "file://" + t.TempDir(), Job: master.Config{JobID: "st", MinNodes: 1, MaxNodes: 1}})
		c := m.client(t, token)
		ctx := t.Context()
		start := time.Now()
		_, err := c.Store(ctx, &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Wait{Wait: &masterpb.StoreWait{Keys: []string{"k"}, TimeoutMs: 200}}})
		if status.Code(err) != codes.DeadlineExceeded || time.Since(start) != 200*time.Millisecond {
			t.Errorf("wait on a missing key: %v after %v, want DeadlineExceeded after 200ms", err, time.Since(start))
		}
		waited := make(chan error, 1)
		go func() {
			_, err := c.Store(ctx, &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Wait{Wait: &masterpb.StoreWait{Keys: []string{"a", "b"}, TimeoutMs: 5000}}})
			waited <- err
		}()
		add := func(seq uint64) int64 {
			res, err := c.Store(ctx, &masterpb.StoreRequest{Client: "w0", Seq: seq, Op: &masterpb.StoreRequest_Add{Add: &masterpb.StoreAdd{Key: "a", Delta: 5}}})
			if err != nil {
				t.Fatal(err)
			}
			return res.GetNumber()
		}
		if add(1) != 5 || add(1) != 5 || add(2) != 10 {
			t.Error("a retried add applied twice")
		}
		synctest.Wait()
		select {
		case err := <-waited:
			t.Fatalf("wait for a and b returned with b missing: %v", err)
		default:
		}
		if _, err := c.Store(ctx, &masterpb.StoreRequest{Client: "w0", Seq: 3, Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: "b", Value: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
		if err := <-waited; err != nil {
			t.Errorf("wait: %v", err)
		}
	})
}

// The master is SIGKILLed mid-job and restarted on the same state: no
// acknowledged store operation is lost, a retried one is not applied twice,
// and the nodes carry on in their round without a new one.
func TestMasterKilledAndRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts master processes")
	}
	state := "file://" + t.TempDir()
	port := testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	start := func() *exec.Cmd { return masterCommand(t, addr, state, 2, 2, true) }
	m := start()
	c := dial(t, addr, token)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var g errgroup.Group
	for i := range 2 {
		g.Go(func() error {
			_, err := retryJoin(ctx, c, node(i), 0)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	// A client adds 1 at a time; every acknowledged add is counted. The
	// master is killed in the middle.
	var acked atomic.Int64
	var lastSeq atomic.Uint64
	// progress carries each acknowledged seq to ackedAtLeast (the latest
	// only, when it is not read in time).
	progress := make(chan int64, 1)
	ackedAtLeast := func(n int64) {
		t.Helper()
		for acked.Load() < n {
			select {
			case <-progress:
			case <-ctx.Done():
				t.Fatalf("%d adds acknowledged, waited for %d", acked.Load(), n)
			}
		}
	}
	stop := make(chan struct{})
	adderDone := make(chan error, 1)
	go func() {
		var seq uint64
		for {
			select {
			case <-stop:
				adderDone <- nil
				return
			default:
			}
			seq++
			for {
				cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
				res, err := c.Store(cctx, &masterpb.StoreRequest{Client: "adder", Seq: seq,
					Op: &masterpb.StoreRequest_Add{Add: &masterpb.StoreAdd{Key: "count", Delta: 1}}})
				ccancel()
				if err == nil {
					if res.GetNumber() != int64(seq) {
						adderDone <- fmt.Errorf("add #%d answered %d: an add was lost or applied twice", seq, res.GetNumber())
						return
					}
					acked.Store(int64(seq))
					lastSeq.Store(seq)
					select {
					case progress <- int64(seq):
					default:
					}
					break
				}
				if ctx.Err() != nil {
					adderDone <- ctx.Err()
					return
				}
				time.Sleep(20 * time.Millisecond) // retried with the same seq
			}
		}
	}()
	ackedAtLeast(20) // the master is killed in the middle of the adds
	before := acked.Load()
	_ = m.Process.Signal(syscall.SIGKILL)
	_ = m.Wait()
	killedAt := time.Now()
	m = start()
	defer func() { _ = m.Process.Kill(); _ = m.Wait() }()
	// The nodes heartbeat in round 1 as before: no restart asked.
	var back time.Duration
	for {
		res, err := c.Heartbeat(ctx, &masterpb.HeartbeatRequest{Node: node(0), Round: 1})
		if err == nil {
			back = time.Since(killedAt)
			if res.GetAction() != masterpb.HeartbeatResponse_NONE || res.GetLatestRound() != 1 {
				t.Errorf("after the restart: %v, want no action in round 1", res)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ackedAtLeast(acked.Load() + 20) // adds go on after the restart
	close(stop)
	if err := <-adderDone; err != nil {
		t.Fatal(err)
	}
	res, err := c.Store(ctx, &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: "count"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.GetValue()); got != strconv.FormatUint(lastSeq.Load(), 10) {
		t.Errorf("count = %s after %d acknowledged adds", got, lastSeq.Load())
	}
	t.Logf("acknowledged adds before the kill: %d, after: %d; master back (first answer) %v after SIGKILL", before, acked.Load(), back)
	st, err := c.Status(ctx, &masterpb.StatusRequest{})
	if err != nil || st.GetRound() != 1 || len(st.GetNodes()) != 2 {
		t.Errorf("status after the restart: %v %v", st, err)
	}
}

func retryJoin(ctx context.Context, c masterpb.MasterClient, n *masterpb.Node, after int64) (*masterpb.Round, error) {
	for {
		r, err := join(ctx, c, n, after)
		if err == nil || ctx.Err() != nil || status.Code(err) != codes.Unavailable {
			return r, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type prefixWriter struct {
	t      testing.TB
	prefix string
	mu     sync.Mutex
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(w.prefix + l)
	}
	return len(p), nil
}

// /metrics serves the master's metrics in Prometheus' format.
func TestMetrics(t *testing.T) {
	addr, s := startServer(t, master.Config{JobID: "m", MinNodes: 1, MaxNodes: 1}, "")
	c := dial(t, addr, token)
	if _, err := join(t.Context(), c, node(0), 0); err != nil {
		t.Fatal(err)
	}
	dial(t, addr, "wrong").Status(t.Context(), &masterpb.StatusRequest{})
	srv := &http.Server{Handler: s.MetricsHandler()}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)
	defer srv.Close()
	res, err := http.Get("http://" + l.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{`kfelastic_master_nodes{state="running"} 1`, "kfelastic_master_rounds_total 1",
		"kfelastic_master_round 1", "kfelastic_master_unauthenticated_total 1", "kfelastic_master_rendezvous_seconds_count 1"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	_ = filepath.Join
}

// A relaunch the master decides is drawn in the report: the master appends
// a relaunch event next to the job's error documents.
func TestRelaunchEventWritten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		m := startInBubble(t, master.Options{StateURL: "file://" + t.TempDir(), EventsURL: "file://" + dir,
			Job: master.Config{JobID: "ev", MinNodes: 1, MaxNodes: 2}})
		c := m.client(t, token)
		ctx := t.Context()
		joinAll(t, c, 2)
		res, err := c.Leave(ctx, &masterpb.LeaveRequest{Node: node(1), Failure: &masterpb.Failure{Code: "Preempted", Recoverable: true, Message: "SIGTERM"}})
		if err != nil || !res.GetRelaunch() {
			t.Fatalf("leave: %v %v", res, err)
		}
		synctest.Wait() // the event is written in the background
		b, err := kferrors.OpenPrefix(ctx, "file://"+dir, false)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		log, err := events.Read(ctx, b, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(log.Events) != 1 {
			t.Fatalf("events %+v, want one relaunch", log.Events)
		}
		if ev := log.Events[0]; ev.Kind != events.Relaunch || ev.Pod != "job-worker-1" || ev.Code != "Preempted" || ev.Reason != "relaunch" {
			t.Errorf("event %+v", ev)
		}
	})
}

// A round tells its members how many members of the round before are gone
// from it: a pod's restarted container (a new incarnation) is a new member,
// its old one departed, whose torch c10d node a command-mode agent's relay
// can then forget at once (agent/storerelay/c10dstate.go). The count is
// marked known, so that 0 can say "none" (the scenario scripts' "none
// departed", a scale-up's) apart from "the master does not know".
func TestRoundSaysDeparted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startInBubble(t, master.Options{StateURL: "mem://",
			Job: master.Config{JobID: "departed", MinNodes: 2, MaxNodes: 2, WaitingTimeout: 100 * time.Millisecond}})
		c := m.client(t, token)
		ctx := t.Context()
		rounds := joinAll(t, c, 2)
		if rounds[0].GetDeparted() != 0 || rounds[0].GetDepartedKnown() {
			t.Errorf("first round: departed %d (known %v), want 0, no round before", rounds[0].GetDeparted(), rounds[0].GetDepartedKnown())
		}
		restarted := node(1)
		restarted.Incarnation = "2"
		var g errgroup.Group
		g.Go(func() (err error) { rounds[0], err = join(ctx, c, node(0), 1); return err })
		g.Go(func() (err error) { rounds[1], err = join(ctx, c, restarted, 0); return err })
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		for i, r := range rounds {
			if r.GetNumber() != 2 || r.GetDeparted() != 1 || !r.GetDepartedKnown() {
				t.Errorf("member %d: round %d, departed %d (known %v); want round 2, 1 departed, known", i, r.GetNumber(), r.GetDeparted(), r.GetDepartedKnown())
			}
		}
	})
}

// An owner in the master's process hears of each round the master
// completes, with its members' pods by group rank: the local engine learns
// rounds so, not from the agents' output.
func TestOnRoundTellsTheMembers(t *testing.T) {
	told := make(chan master.CompletedRound, 4)
	m := mastertest.StartWith(t, master.Options{Job: master.Config{JobID: "told", MinNodes: 2, MaxNodes: 2},
		OnRound: func(r master.CompletedRound) { told <- r }})
	joinAll(t, dial(t, m.Addr, token), 2)
	select {
	case r := <-told:
		if r.Number != 1 || strings.Join(r.Pods, " ") != "job-worker-0 job-worker-1" || r.WorldSize != 4 || r.At.IsZero() {
			t.Errorf("told %+v; want round 1 of job-worker-0 and job-worker-1, 4 workers", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no round told")
	}
	select {
	case r := <-told:
		t.Errorf("a second round told: %+v", r)
	default:
	}
}

// Two live agents under one pod name and rank (a pod deleted by force while
// its container still ran, recreated under its name): the newer takes the
// rank over; the older, holding a heartbeat, is told at once to exit
// (Replaced), not to restart, and its join does not take the rank back.
// Issue 28: the older was told to restart by its held heartbeat once the
// newer ran in a round, joined again as "pod restarted", and the two took
// the rank from each other without end.
func TestDuplicatePodFenced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startInBubble(t, master.Options{StateURL: "mem://",
			Job: master.Config{JobID: "dup", MinNodes: 2, MaxNodes: 2}})
		c := m.client(t, token)
		ctx := t.Context()
		joinAll(t, c, 2)
		older, newer := node(0), node(0)
		newer.Incarnation = "2"
		told := make(chan *masterpb.HeartbeatResponse, 1)
		go func() {
			res, err := c.Heartbeat(ctx, &masterpb.HeartbeatRequest{Node: older, Round: 1, WaitMs: 20000, Step: -1})
			if err != nil {
				t.Errorf("older's heartbeat: %v", err)
			}
			told <- res
		}()
		synctest.Wait() // the master holds the older's heartbeat
		var g errgroup.Group
		var rounds [2]*masterpb.Round
		g.Go(func() (err error) { rounds[0], err = join(ctx, c, newer, 0); return err })
		res := <-told
		if res.GetAction() != masterpb.HeartbeatResponse_EXIT || res.GetExit().GetCode() != "Replaced" || res.GetExit().GetRelaunch() {
			t.Errorf("the older incarnation's held heartbeat: %v, want exit Replaced, no relaunch", res)
		}
		// The other member restarts into the round with the newer one.
		g.Go(func() (err error) { rounds[1], err = join(ctx, c, node(1), 1); return err })
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		if rounds[0].GetNumber() != 2 || rounds[1].GetNumber() != 2 {
			t.Fatalf("rounds %v", rounds)
		}
		j, err := c.Join(ctx, &masterpb.JoinRequest{Node: older, AfterRound: 1, WaitMs: 1000})
		if err != nil || j.GetExcluded().GetCode() != "Replaced" {
			t.Errorf("the older incarnation joins again: %v, %v; want excluded, Replaced", j, err)
		}
		st, err := c.Status(ctx, &masterpb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetRound() != 2 {
			t.Errorf("round %d after the older incarnation's join, want 2 (it took the rank back)", st.GetRound())
		}
	})
}
