package master_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master"
)

// runningMaster is a master serving on loopback whose end the test watches
// (mastertest fails a test whose master ends with an error; a fenced one
// here must).
type runningMaster struct {
	addr   string
	c      masterpb.MasterClient
	ended  chan error
	cancel context.CancelFunc
}

func serveState(t *testing.T, jobID, state string) *runningMaster {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := master.NewServer(ctx, master.Options{Token: token, StateURL: state, HeartbeatInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&prefixWriter{t: t, prefix: jobID + ": "}, nil)),
		Job:    master.Config{JobID: jobID, MinNodes: 1, MaxNodes: 2}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	m := &runningMaster{addr: lis.Addr().String(), ended: make(chan error, 1), cancel: cancel}
	go func() { m.ended <- s.Serve(ctx, lis) }()
	m.c = dial(t, m.addr, token)
	t.Cleanup(func() {
		cancel()
		select {
		case <-m.ended:
		case <-time.After(10 * time.Second):
			t.Error("master did not stop")
		}
	})
	return m
}

// serveStateInBubble is serveState inside the calling synctest bubble.
func serveStateInBubble(t *testing.T, jobID, state string) *runningMaster {
	t.Helper()
	b := startInBubble(t, master.Options{StateURL: state, HeartbeatInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&prefixWriter{t: t, prefix: jobID + ": "}, nil)),
		Job:    master.Config{JobID: jobID, MinNodes: 1, MaxNodes: 2}})
	return &runningMaster{addr: "pipe", c: b.client(t, token), ended: b.ended, cancel: b.cancel}
}

func (m *runningMaster) set(ctx context.Context, client string, seq uint64, key, value string) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := m.c.Store(cctx, &masterpb.StoreRequest{Client: client, Seq: seq,
		Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: key, Value: []byte(value)}}})
	return err
}

func (m *runningMaster) get(ctx context.Context, key string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := m.c.Store(cctx, &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: key}}})
	return string(res.GetValue()), err
}

func files(t *testing.T, dir, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A file:// state on another file system than os.TempDir() (a tmpfs here,
// TMPDIR on disk) gets its snapshot: batches past the snapshot period
// compact the logs, every state file is 0600, and a restarted master
// reloads it. (Before, the snapshot's rename from /tmp failed with EXDEV
// forever, and every batch serialized the whole state again.)
func TestStateOnAnotherFileSystem(t *testing.T) {
	if testing.Short() {
		t.Skip("a thousand batches")
	}
	ctx := t.Context()
	dir := filepath.Join(testenv.OtherFileSystem(t, 64<<20), "state")
	t.Setenv("TMPDIR", t.TempDir())
	m := serveState(t, "otherfs", "file://"+dir)
	const n = 1100 // past one snapshot period (1000 batches)
	for i := 1; i <= n; i++ {
		if err := m.set(ctx, "w", uint64(i), "k", strconv.Itoa(i)); err != nil {
			t.Fatalf("set #%d: %v", i, err)
		}
	}
	snaps, logs := files(t, dir, "snap/*.pb"), files(t, dir, "log/*")
	if len(snaps) != 1 || len(logs) >= n/2 {
		t.Fatalf("after %d batches: %d snapshots, %d logs", n, len(snaps), len(logs))
	}
	for _, p := range append(snaps, logs...) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
	if tmps := append(files(t, dir, "log/.tmp-*"), files(t, dir, "snap/.tmp-*")...); len(tmps) != 0 {
		t.Errorf("temporary files left: %v", tmps)
	}
	m.cancel()
	<-m.ended
	m.ended <- nil // for the cleanup
	m2 := serveState(t, "otherfs", "file://"+dir)
	if v, err := m2.get(ctx, "k"); err != nil || v != strconv.Itoa(n) {
		t.Errorf("after a restart: k = %q, %v; want %d", v, err, n)
	}
}

// A master whose state a newer master has claimed (by starting on it)
// answers nothing from it, reads included: not a GET, not a status, not a
// held call's "nothing yet". It stops, fenced, at its next batch. The newer
// master may also have compacted the state into a snapshot, deleting the
// older master's log segment: that fences it too.
func TestFencedMasterAnswersNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		batches int  // the newer master's batches before the call
		held    bool // the call is made before the newer master starts, and held meanwhile
		call    func(ctx context.Context, m *runningMaster) error
	}{
		{"get", 0, false, func(ctx context.Context, m *runningMaster) error { _, err := m.get(ctx, "k"); return err }},
		{"status", 0, false, func(ctx context.Context, m *runningMaster) error {
			_, err := m.c.Status(ctx, &masterpb.StatusRequest{})
			return err
		}},
		{"set", 0, false, func(ctx context.Context, m *runningMaster) error { return m.set(ctx, "a", 2, "k", "stale") }},
		{"held wait", 0, true, func(ctx context.Context, m *runningMaster) error {
			_, err := m.c.Store(ctx, &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Wait{Wait: &masterpb.StoreWait{Keys: []string{"absent"}, TimeoutMs: 1000}}})
			return err
		}},
		{"get after a snapshot", 1001, false, func(ctx context.Context, m *runningMaster) error { _, err := m.get(ctx, "k"); return err }},
		{"set after a snapshot", 1001, false, func(ctx context.Context, m *runningMaster) error { return m.set(ctx, "a", 2, "k", "stale") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.batches > 1 && testing.Short() {
				t.Skip("a thousand batches")
			}
			synctest.Test(t, func(t *testing.T) { fencedMasterAnswersNothing(t, tc.batches, tc.held, tc.call) })
		})
	}
}

func fencedMasterAnswersNothing(t *testing.T, batches int, held bool, call func(ctx context.Context, m *runningMaster) error) {
	ctx := t.Context()
	// The state on a tmpfs when there is one: fsyncs cost nothing there.
	var dir string
	if os.Geteuid() == 0 {
		dir = testenv.OtherFileSystem(t, 64<<20)
	} else {
		dir = t.TempDir()
	}
	state := "file://" + filepath.Join(dir, "state")
	a := serveStateInBubble(t, "job", state)
	if err := a.set(ctx, "a", 1, "k", "1"); err != nil {
		t.Fatal(err)
	}
	called := make(chan error, 1)
	if held {
		go func() { called <- call(ctx, a) }()
		synctest.Wait() // the first master holds the call
	}
	b := serveStateInBubble(t, "job", state)
	if v, err := b.get(ctx, "k"); err != nil || v != "1" {
		t.Fatalf("the newer master: k = %q %v, want what the first acknowledged", v, err)
	}
	for i := range batches {
		if err := b.set(ctx, "b", uint64(1+i), "k", "2"); err != nil {
			t.Fatal(err)
		}
	}
	if batches > 1000 && len(files(t, filepath.Join(dir, "state"), "snap/*.pb")) == 0 {
		t.Fatal("no snapshot")
	}
	if !held {
		called <- call(ctx, a)
	}
	err := <-called
	if err == nil {
		t.Fatalf("the fenced master answered")
	}
	if c := status.Code(err); c != codes.Unavailable && c != codes.Aborted && c != codes.FailedPrecondition {
		t.Errorf("the fenced master's refusal: %v", err)
	}
	select {
	case err := <-a.ended:
		if !errors.Is(err, master.ErrFenced) {
			t.Errorf("the fenced master ended with %v, want ErrFenced", err)
		}
		a.ended <- err
	case <-time.After(5 * time.Second):
		t.Error("the fenced master did not stop")
	}
	want := "1"
	if batches > 0 {
		want = "2"
	}
	if v, err := b.get(ctx, "k"); err != nil || v != want {
		t.Errorf("the newer master: k = %q, %v, want %s", v, err, want)
	}
}

// While the state's disk is full, a call is not held past its deadline:
// it ends with an error (nothing is acknowledged that is not durable), and
// once there is room again the master goes on: the call retried with the
// same sequence number is answered as it was applied, once.
func TestStateDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a small tmpfs (root)")
	}
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		dir := testenv.OtherFileSystem(t, 1<<20)
		m := serveStateInBubble(t, "full", "file://"+filepath.Join(dir, "state"))
		if err := m.set(ctx, "w", 1, "k", "before"); err != nil {
			t.Fatal(err)
		}
		filler := filepath.Join(dir, "filler")
		f, err := os.Create(filler)
		if err != nil {
			t.Fatal(err)
		}
		chunk := make([]byte, 4096)
		for {
			if _, err := f.Write(chunk); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
		f.Close()
		// The set is applied, then held until durable: its caller's deadline
		// ends the wait, unacknowledged. (Its value needs room the state's
		// log segment does not have: a small write into what the segment
		// already holds goes on while the disk is full.)
		big := strings.Repeat("x", 64<<10)
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err = m.set(cctx, "w", 2, "big", big)
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("a set while the state cannot be written: %v, want DeadlineExceeded", err)
		}
		// Later calls, reads included, wait behind it (their answers may
		// depend on it) and end at their own deadline too.
		for _, call := range []func(context.Context) error{
			func(ctx context.Context) error {
				_, err := m.c.Store(ctx, &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: "k"}}})
				return err
			},
			func(ctx context.Context) error { _, err := m.c.Status(ctx, &masterpb.StatusRequest{}); return err },
		} {
			cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			start := time.Now()
			err := call(cctx)
			cancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("a call while the state cannot be written: %v, want DeadlineExceeded", err)
			}
			if d := time.Since(start); d != 500*time.Millisecond {
				t.Errorf("held %v, want its 500 ms deadline", d)
			}
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		// The master retries its write on its own (backoff on the bubble's
		// clock); the retried call waits behind it.
		cctx, cancel = context.WithTimeout(ctx, 20*time.Second)
		err = m.set(cctx, "w", 2, "big", big)
		cancel()
		if err != nil {
			t.Fatalf("the set retried once there is room: %v", err)
		}
		if v, err := m.get(ctx, "big"); err != nil || v != big {
			t.Errorf("after the retried set: %d bytes, %v", len(v), err)
		}
	})
}

// --state and --error-prefix file URLs that are ambiguous are refused at
// start with a message that names the flag and says what to write; nothing
// is written (file://stateA would have written the state at the root).
func TestAmbiguousStateURLRefused(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, tc := range []struct{ state, events, flag string }{
		{"file://stateA", "", "--state"},
		{"file:stateA", "", "--state"},
		{"file://" + t.TempDir(), "file://errs", "--error-prefix"},
	} {
		_, err := master.NewServer(t.Context(), master.Options{Token: token, StateURL: tc.state, EventsURL: tc.events,
			Job: master.Config{JobID: "j", MinNodes: 1, MaxNodes: 1}})
		if err == nil {
			t.Fatalf("%s %s: started", tc.state, tc.events)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, tc.flag+":") || !strings.Contains(msg, "file:///") || strings.Contains(msg, "error prefix") {
			t.Errorf("state %s, events %s: %v", tc.state, tc.events, msg)
		}
	}
	for _, p := range []string{"/log", "/snap", "stateA", "log"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s was created", p)
		}
	}
}

// Two jobs given the same --rdzv-id and --state never share it: the
// second one's master, under another token, refuses the state at start
// (and claims nothing: the first master goes on); its own token's master
// loads it.
func TestStateOfAnotherTokenRefused(t *testing.T) {
	ctx := t.Context()
	state := "file://" + t.TempDir()
	a := serveState(t, "job", state)
	if err := a.set(ctx, "a", 1, "k", "job A's"); err != nil {
		t.Fatal(err)
	}
	_, err := master.NewServer(ctx, master.Options{Token: "another job's token", StateURL: state,
		Job: master.Config{JobID: "job", MinNodes: 1, MaxNodes: 2}})
	if !errors.Is(err, master.ErrBadState) || !strings.Contains(err.Error(), "another token") {
		t.Fatalf("a master under another token: %v, want the state refused", err)
	}
	if v, err := a.get(ctx, "k"); err != nil || v != "job A's" {
		t.Errorf("the first master after the refused start: %q %v", v, err)
	}
}

// A replacement pod that waits for its rank while the old pod still holds
// it (a claim, docs/DESIGN.md §5.2) is not told to exit by a master
// restarted on the same state: its heartbeat is answered as before the
// restart, and once the old pod leaves it takes the rank over and is a
// member of the next round.
func TestClaimSurvivesMasterRestart(t *testing.T) {
	ctx := t.Context()
	state := "file://" + t.TempDir()
	a := serveState(t, "claim", state)
	joinAll(t, a.c, 2)
	old, repl := node(1), node(1)
	repl.Pod = "job-worker-1-replacement"
	res, err := a.c.Join(ctx, &masterpb.JoinRequest{Node: repl})
	if err != nil || res.GetPending() == nil {
		t.Fatalf("the replacement's join: %v %v, want pending", res, err)
	}
	heartbeat := func(m *runningMaster, when string) {
		t.Helper()
		hb, err := m.c.Heartbeat(ctx, &masterpb.HeartbeatRequest{Node: repl, Step: -1})
		if err != nil || hb.GetAction() != masterpb.HeartbeatResponse_NONE {
			t.Fatalf("the replacement's heartbeat %s: %v %v, want no action", when, hb, err)
		}
	}
	heartbeat(a, "before the restart")
	a.cancel()
	a.ended <- <-a.ended // for the cleanup
	b := serveState(t, "claim", state)
	heartbeat(b, "after the restart")
	if _, err := b.c.Leave(ctx, &masterpb.LeaveRequest{Node: old,
		Failure: &masterpb.Failure{Code: "Preempted", Message: "deleted", Recoverable: true}}); err != nil {
		t.Fatalf("the old pod's leave: %v", err)
	}
	var g errgroup.Group
	rounds := make([]*masterpb.Round, 2)
	g.Go(func() (err error) { rounds[0], err = join(ctx, b.c, node(0), 1); return err })
	g.Go(func() (err error) { rounds[1], err = join(ctx, b.c, repl, 0); return err })
	if err := g.Wait(); err != nil {
		t.Fatalf("the round after the hand-over: %v", err)
	}
	for i, r := range rounds {
		if r.GetNumber() != 2 || r.GetGroupWorldSize() != 2 || r.GetGroupRank() != int32(i) {
			t.Errorf("member %d: %v, want group rank %d of 2 in round 2", i, r, i)
		}
	}
}
