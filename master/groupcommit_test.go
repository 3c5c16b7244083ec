package master_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
		args := []string{os.Args[0], "-test.run=^$"}
		if traced {
			args = append([]string{strace, "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", trace}, args...)
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "KFELASTIC_TEST_MASTER="+addr, "KFELASTIC_TEST_STATE="+state,
			"KFELASTIC_TEST_MIN=1", "KFELASTIC_TEST_MAX=1")
		cmd.Stderr = &prefixWriter{t: t, prefix: "master: "}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
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
