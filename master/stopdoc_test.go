package master_test

import (
	"strings"
	"testing"
	"testing/synctest"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"gocloud.dev/blob"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master"
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
	var keys []string
	it := b.List(&blob.ListOptions{})
	for {
		o, err := it.Next(t.Context())
		if err != nil {
			break
		}
		if kferrors.IsDocumentKey(o.Key) {
			keys = append(keys, o.Key)
		}
	}
	return keys
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
