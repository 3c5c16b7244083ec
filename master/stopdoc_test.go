package master_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"gocloud.dev/blob"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

// A master that ends when its job is done (--kube-job) ends too when the job
// was stopped and every node has left, after writing its own JobStopped
// document; a master restarted on the same state ends again at once and
// writes no second one. Before, it served on: a stopped job whose pods all
// exited 0 (flytekit writes its document and exits 0) kept its PyTorchJob
// Running, and E2 timed out on CI.
func TestStoppedJobMasterEndsWithItsDocument(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		state, docs := "file://"+t.TempDir(), t.TempDir()
		opts := master.Options{StateURL: state, EventsURL: "file://" + docs, ExitWhenDone: true, Pod: "job-master-0",
			Job: master.Config{JobID: "stop", MinNodes: 2, MaxNodes: 2}}
		m := startInBubble(t, opts)
		c := m.client(t, token)
		ctx := t.Context()
		joinAll(t, c, 2)
		userError := &masterpb.Failure{Code: "ValueError", Message: "loss is NaN"}
		if _, err := c.Leave(ctx, &masterpb.LeaveRequest{Node: node(1), Failure: userError}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if m.Server.StoppedForGood() {
			t.Fatal("the master ended while node 0 still runs")
		}
		if n := documents(t, docs); len(n) != 0 {
			t.Fatalf("documents %v before every node left", n)
		}
		gloo := &masterpb.Failure{Code: "RuntimeError", Message: "Connection closed by peer"}
		if _, err := c.Leave(ctx, &masterpb.LeaveRequest{Node: node(0), Failure: gloo}); err != nil {
			t.Fatal(err)
		}
		if err := <-m.ended; err != nil {
			t.Fatalf("Serve: %v", err)
		}
		m.ended <- nil
		if !m.Server.StoppedForGood() || m.Server.Succeeded() {
			t.Fatalf("stopped for good %v, succeeded %v: want stopped", m.Server.StoppedForGood(), m.Server.Succeeded())
		}
		keys := documents(t, docs)
		if len(keys) != 1 {
			t.Fatalf("documents %v, want the master's one", keys)
		}
		f := readFailure(t, docs, keys[0])
		if f.Code != kferrors.CodeJobStopped || f.Worker != "job-master-0" || !f.Recoverable || f.Origin != core.ExecutionError_SYSTEM ||
			!strings.Contains(f.Message, "lost for good rank 1 (job-worker-1, ValueError)") || f.Time.IsZero() {
			t.Errorf("the master's document: %+v", f)
		}

		again := startInBubble(t, opts)
		if err := <-again.ended; err != nil {
			t.Fatalf("restarted Serve: %v", err)
		}
		again.ended <- nil
		if !again.Server.StoppedForGood() {
			t.Error("the restarted master did not end")
		}
		if k := documents(t, docs); len(k) != 1 {
			t.Errorf("documents %v after a restart, want still one", k)
		}
	})
}

// documents lists the error documents under dir.
func documents(t *testing.T, dir string) []string {
	t.Helper()
	b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// kferrors.ListPage, as the reader lists: fileblob fails a listing
	// whose folder changes under it (a write's temporary file renamed, a
	// move to superseded/), and the master writes beside the test. Ending
	// the listing at the first error once read a busy folder as empty
	// (TestDepartedPodsDocumentsMoveAside, make test's grpc leg).
	var keys []string
	for token := blob.FirstPageToken; ; {
		page, next, err := kferrors.ListPage(t.Context(), b, token, 1000, &blob.ListOptions{})
		if err != nil {
			t.Fatalf("listing %s: %v", dir, err)
		}
		for _, o := range page {
			if kferrors.IsDocumentKey(o.Key) {
				keys = append(keys, o.Key)
			}
		}
		if len(next) == 0 {
			return keys
		}
		token = next
	}
}

// readFailure decodes one document under dir.
func readFailure(t *testing.T, dir, key string) kferrors.Failure {
	t.Helper()
	b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	data, err := kferrors.ReadDocument(t.Context(), b, key, kferrors.DefaultMaxDocumentBytes)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := kferrors.Decode(data, kferrors.DefaultMaxDocumentBytes)
	if err != nil {
		t.Fatal(err)
	}
	f, err := kferrors.FromDocument(doc)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A hardware fault a node daemon reported takes its live pod out: the
// master writes the pod's document (once per event, however often it is
// told) and relaunches the rank on another node without spending budget.
func TestHardwareFaultTakesThePodOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		docs := t.TempDir()
		owner := &recordingOwner{}
		m := startInBubble(t, master.Options{StateURL: "mem://", EventsURL: "file://" + docs, Owner: owner,
			Job: master.Config{JobID: "hw", MinNodes: 1, MaxNodes: 2}})
		c := m.client(t, token)
		joinAll(t, c, 2)
		g := kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 79, Severity: kferrors.SeverityCritical, GPUIndex: 3, Node: "node-1"}
		f, _ := g.Failure("job-worker-1", time.Now().Add(-time.Second), "")
		for range 2 {
			if err := m.Server.HardwareFault(t.Context(), "job-worker-1", f, "00000000000000e1"); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		keys := documents(t, docs)
		if len(keys) != 1 {
			t.Fatalf("documents %v, want one", keys)
		}
		if got := readFailure(t, docs, keys[0]); got.Code != kferrors.CodeGpuFallenOffBus || got.Worker != "job-worker-1" ||
			!strings.Contains(got.Message, "Xid 79 (GPU has fallen off the bus) on GPU 3 on node node-1") {
			t.Errorf("document %+v", got)
		}
		var found bool
		for _, d := range owner.carried() {
			if d.Rank == 1 && d.Reason == kferrors.CodeGpuFallenOffBus {
				found = true
				if d.Kind != relaunch.AvoidHost || d.Counted || d.Host != "node-1" {
					t.Errorf("decision %+v, want relaunch-avoid-host on node-1, not counted", d)
				}
			}
		}
		if !found {
			t.Errorf("no decision for rank 1: %+v", owner.carried())
		}
	})
}

// recordingOwner is a PodOwner that records the decisions it is handed.
type recordingOwner struct {
	mu sync.Mutex
	ds []master.Decision
}

func (o *recordingOwner) Carry(_ context.Context, d master.Decision) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ds = append(o.ds, d)
	return nil
}

func (o *recordingOwner) carried() []master.Decision {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.ds)
}
