package master_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master"
)

// A job that goes on without a pod — its GPU fell off the bus, and its
// replacement, kept off that node, never trains — recovered from the pod's
// failure: the master moves the pod's documents (its agent's and its own)
// to superseded/ when the round without it completes, and a late upload
// when the job succeeds, so that the plugin reads a success. A member's
// documents are its own agent's to move (at its group's start): the master
// leaves them. Without SupersedeDeparted (the local engine) it moves
// nothing. Real time, not a synctest bubble: documents dated 2000 have no
// usable time.
func TestDepartedPodsDocumentsMoveAside(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[on], func(t *testing.T) { departedPodsDocuments(t, on) })
	}
}

func departedPodsDocuments(t *testing.T, on bool) {
	docs := t.TempDir()
	ctx := t.Context()
	write := func(f kferrors.Failure) string {
		t.Helper()
		b, err := kferrors.OpenPrefix(ctx, "file://"+docs, true)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		key, err := kferrors.NewWriter(b, nil).Write(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	m := startInBubble(t, master.Options{StateURL: "mem://", EventsURL: "file://" + docs, ExitWhenDone: true, SupersedeDeparted: on,
		Pod: "job-master-0", Job: master.Config{JobID: "departed", MinNodes: 2, MaxNodes: 3, WaitingTimeout: 300 * time.Millisecond}})
	c := m.client(t, token)
	joinAll(t, c, 3)
	// Worker 1's ranks fail with NCCL's watchdog timeout; the node daemon's
	// Xid 79 follows. Worker 0 restarted in place after an earlier failure.
	nccl := write(kferrors.SystemFailure(kferrors.CodeNcclTimeout, "Watchdog caught collective operation timeout", "job-worker-1/0", time.Now().Add(-2*time.Second)))
	member := write(kferrors.UserError("RuntimeError", "Connection closed by peer", "job-worker-0", time.Now().Add(-time.Second)))
	g := kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 79, Severity: kferrors.SeverityCritical, GPUIndex: 0, Node: "node-1"}
	f, _ := g.Failure("job-worker-1", time.Now().Add(-time.Second), "")
	if err := m.Server.HardwareFault(ctx, "job-worker-1", f, "00000000000000e1"); err != nil {
		t.Fatal(err)
	}
	main := documents(t, docs)
	if len(main) != 3 {
		t.Fatalf("documents %v before the round, want worker 1's two and worker 0's", main)
	}
	// Workers 0 and 2 go on in round 2, after its last call for worker 1.
	var eg errgroup.Group
	for _, i := range []int{0, 2} {
		eg.Go(func() error { _, err := join(ctx, c, node(i), 1); return err })
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	// The move runs beside the master's loop.
	for end := time.Now().Add(10 * time.Second); on && len(superseded(t, docs)) < 2 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	if !on {
		time.Sleep(500 * time.Millisecond)
	}
	moved := superseded(t, docs)
	if slices.Contains(moved, nccl) != on || !slices.Contains(documents(t, docs), member) {
		t.Fatalf("after round 2 (supersede %v): superseded %v, in place %v", on, moved, documents(t, docs))
	}
	if on && len(moved) != 2 {
		t.Errorf("superseded %v, want worker 1's agent's and the master's hardware document", moved)
	}
	// Worker 1's agent uploads one more, late; then the job succeeds.
	late := write(kferrors.UserError("RuntimeError", "ncclRemoteError", "job-worker-1/1", time.Now()))
	for _, i := range []int{0, 2} {
		if _, err := c.Leave(ctx, &masterpb.LeaveRequest{Node: node(i), Succeeded: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-m.ended; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	m.ended <- nil
	if !m.Server.Succeeded() {
		t.Fatal("the job did not succeed")
	}
	left := documents(t, docs)
	switch {
	case on && (!slices.Equal(left, []string{member}) || !slices.Contains(superseded(t, docs), late)):
		t.Errorf("at the job's success: in place %v, superseded %v; want only worker 0's in place", left, superseded(t, docs))
	case !on && len(left) != 4:
		t.Errorf("without SupersedeDeparted: in place %v, want all four", left)
	}
}

// superseded are the document keys under superseded/, without the prefix.
func superseded(t *testing.T, dir string) []string {
	t.Helper()
	sub := filepath.Join(dir, strings.TrimSuffix(kferrors.SupersededPrefix, "/"))
	if _, err := os.Stat(sub); os.IsNotExist(err) {
		return nil
	}
	return documents(t, sub)
}
