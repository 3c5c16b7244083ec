package master_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master"
)

// Concurrent store writers share batches (group commit): a master process
// answering 16 clients' adds writes far fewer batches than it acknowledges,
// and fsyncs once per batch (an fdatasync of its log segment), never per
// operation; counted with strace where it is installed. The master is then
// SIGKILLed and restarted on the same state: every acknowledged add is
// there, once, and a retried one is answered as it was, not applied again.
func TestGroupCommitConcurrentWriters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts master processes")
	}
	dir := t.TempDir()
	state := "file://" + dir
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	trace := filepath.Join(t.TempDir(), "fsyncs")
	strace, _ := exec.LookPath("strace")
	start := func(traced bool) (*exec.Cmd, int) {
		t.Helper()
		cmd := masterCommand(t, addr, state, 1, 1, false)
		if traced {
			cmd.Path = strace
			cmd.Args = append([]string{strace, "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", trace}, cmd.Args...)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if l, err := bufio.NewReader(out).ReadString('\n'); err != nil || l != "serving\n" {
			t.Fatalf("master: %q %v", l, err)
		}
		pid := cmd.Process.Pid
		if traced { // the master is strace's child
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
			if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
				t.Fatalf("strace's child: %q %v", b, err)
			}
		}
		return cmd, pid
	}
	cmd, pid := start(strace != "")
	c := dial(t, addr, token)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const clients, adds = 16, 25
	add := func(i int, seq uint64) (int64, error) {
		res, err := c.Store(ctx, &masterpb.StoreRequest{Client: fmt.Sprintf("c%d", i), Seq: seq,
			Op: &masterpb.StoreRequest_Add{Add: &masterpb.StoreAdd{Key: fmt.Sprintf("k%d", i), Delta: 1}}})
		return res.GetNumber(), err
	}
	var g errgroup.Group
	for i := range clients {
		g.Go(func() error {
			for seq := uint64(1); seq <= adds; seq++ {
				n, err := add(i, seq)
				if err != nil {
					return err
				}
				if n != int64(seq) {
					return fmt.Errorf("client %d's add #%d answered %d", i, seq, n)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	// Every add is acknowledged: kill the master before it does anything else.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	const ops = clients * adds
	batches, err := master.StateBatches(dir)
	if err != nil {
		t.Fatal(err)
	}
	// A batch costs little CPU beside the calls it answers (an fdatasync in
	// place), so batches are smaller than when each was a new file; on a
	// loaded machine they grow.
	if batches == 0 || batches > ops*3/4 {
		t.Errorf("%d acknowledged adds from %d clients in %d batches, want at most %d", ops, clients, batches, ops*3/4)
	}
	if strace != "" {
		b, err := os.ReadFile(trace)
		if err != nil {
			t.Fatal(err)
		}
		fsyncs := strings.Count(string(b), "fsync(") + strings.Count(string(b), "fdatasync(")
		// Loading syncs the state's folders, claims a segment and writes
		// its header, once.
		if fsyncs > batches+6 {
			t.Errorf("%d fsyncs for %d batches (%d adds), want 1 per batch", fsyncs, batches, ops)
		}
		t.Logf("%d adds from %d clients: %d batches, %d fsyncs", ops, clients, batches, fsyncs)
	} else {
		t.Logf("%d adds from %d clients: %d batches (no strace here to count fsyncs)", ops, clients, batches)
	}
	start(false)
	for i := range clients {
		// The last add retried: answered as it was, not applied again.
		if n, err := add(i, adds); err != nil || n != adds {
			t.Errorf("client %d's last add retried after the restart: %d %v, want %d", i, n, err, adds)
		}
		res, err := c.Store(ctx, &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: fmt.Sprintf("k%d", i)}}})
		if err != nil || string(res.GetValue()) != strconv.Itoa(adds) {
			t.Errorf("k%d after the restart: %q %v, want %d", i, res.GetValue(), err, adds)
		}
	}
}

// The master is SIGKILLed again and again while 8 clients add, at times
// that land in the middle of writes (a frame torn at its segment's tail)
// and restarted on the same state each time, a new segment each: every
// acknowledged add is there, exactly once, whatever the kills tore, and a
// retried add is answered as it was applied.
func TestMasterKilledRepeatedlyMidWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts master processes")
	}
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	start := func() *exec.Cmd { return masterCommand(t, addr, "file://"+dir, 1, 1, true) }
	m := start()
	c := dial(t, addr, token)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const clients, kills = 8, 12
	acked := make([]atomic.Uint64, clients)
	stop := make(chan struct{})
	var g errgroup.Group
	for i := range clients {
		g.Go(func() error {
			for seq := uint64(1); ; seq++ {
				for { // the same seq until it is answered
					select {
					case <-stop:
						return nil
					default:
					}
					cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
					res, err := c.Store(cctx, &masterpb.StoreRequest{Client: fmt.Sprintf("c%d", i), Seq: seq,
						Op: &masterpb.StoreRequest_Add{Add: &masterpb.StoreAdd{Key: fmt.Sprintf("k%d", i), Delta: 1}}})
					ccancel()
					if err == nil {
						if res.GetNumber() != int64(seq) {
							return fmt.Errorf("client %d's add #%d answered %d: an add lost or applied twice", i, seq, res.GetNumber())
						}
						acked[i].Store(seq)
						break
					}
					if ctx.Err() != nil {
						return ctx.Err()
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	total := func() (n uint64) {
		for i := range acked {
			n += acked[i].Load()
		}
		return n
	}
	for k := range kills {
		// Some adds in, then the kill, a few milliseconds into the next
		// batches.
		for want := total() + 40; total() < want; {
			if ctx.Err() != nil {
				t.Fatalf("kill %d: %d adds acknowledged, waited for %d", k, total(), want)
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		_ = m.Process.Signal(syscall.SIGKILL)
		_ = m.Wait()
		m = start()
	}
	for want := total() + 40; total() < want && ctx.Err() == nil; {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Process.Kill(); _ = m.Wait() }()
	for i := range clients {
		res, err := c.Store(ctx, &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: fmt.Sprintf("k%d", i)}}})
		if err != nil {
			t.Fatal(err)
		}
		// The last add may have been applied and its answer lost with the
		// master: at most one more than acknowledged.
		if n, _ := strconv.ParseUint(string(res.GetValue()), 10, 64); n != acked[i].Load() && n != acked[i].Load()+1 {
			t.Errorf("client %d: k%d = %d, %d adds acknowledged", i, i, n, acked[i].Load())
		}
	}
	// Each start left a segment; none is bigger than its batches need
	// (the first chunk a segment allocates is small).
	segs, _ := filepath.Glob(filepath.Join(dir, "log", "*.seg"))
	var bytes int64
	for _, p := range segs {
		if fi, err := os.Stat(p); err == nil {
			bytes += fi.Size()
		}
	}
	t.Logf("%d kills, %d adds acknowledged, %d segments, %d KiB", kills, total(), len(segs), bytes>>10)
	if bytes > int64(len(segs))*256<<10 {
		t.Errorf("%d segments take %d KiB", len(segs), bytes>>10)
	}
}
