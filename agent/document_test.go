package agent

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"gocloud.dev/blob/memblob"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/flytekitdoc"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Issue 27, item 4: the command's own document over the reader's limit (a
// long exception text; flytekit writes it whole) is read by the agent,
// which rewrites it under the limit, its message capped head and tail, and
// moves flytekit's aside: the reader then reads the pod's failure instead
// of skipping it. The agent's document logic on a mem:// bucket, no
// processes.
func TestOversizedCommandDocumentRewrittenUnderTheReadersLimit(t *testing.T) {
	ctx := t.Context()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	second := time.Date(2026, 11, 25, 21, 33, 6, 0, time.UTC)
	exc := "ValueError: loss is NaN; the batch was " + strings.Repeat("[nan, nan, nan] ", 200_000) // ≈3.2 MB
	f := flytekitdoc.Failure("job-worker-1", exc, t.TempDir()+"/run/attempt_0/0/error.json", second)
	data, err := kferrors.Encode(f.Document(len(f.Message)))
	if err != nil {
		t.Fatal(err)
	}
	if len(data) <= kferrors.DefaultMaxDocumentBytes || len(data) > maxCommandDocumentBytes {
		t.Fatalf("document of %d bytes: want one over the reader's limit the agent still reads", len(data))
	}
	key := flytekitdoc.Key()
	if err := b.WriteAll(ctx, key, data, nil); err != nil {
		t.Fatal(err)
	}

	l := &loop{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	got, newKey, ok := l.refineFound(ctx, b, key, nil)
	if !ok || newKey == key {
		t.Fatalf("refineFound: %v %s, want the document rewritten under a new key", ok, newKey)
	}
	if at, ours := kferrors.TimeFromKey(newKey); !ours || !at.Equal(second) {
		t.Errorf("rewritten as %s: want one of our keys, named by the document's time %s", newKey, second)
	}
	if got.Code != flytekitdoc.Code || got.Worker != "job-worker-1" || !got.Time.Equal(second) {
		t.Errorf("the pod's failure %s %s %s: want flytekit's code, worker and time", got.Code, got.Worker, got.Time)
	}
	stored, err := b.ReadAll(ctx, newKey)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) > kferrors.DefaultMaxDocumentBytes {
		t.Fatalf("rewritten document of %d bytes, over the reader's limit %d", len(stored), kferrors.DefaultMaxDocumentBytes)
	}
	sf, err := kferrors.DecodeFailure(stored, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(sf.Message) > kferrors.DefaultMessageCap || !strings.HasPrefix(sf.Message, "Trace:") || !strings.HasSuffix(sf.Message, f.Message[len(f.Message)-100:]) {
		t.Errorf("message of %d bytes: want it capped to %d, head and tail kept", len(sf.Message), kferrors.DefaultMessageCap)
	}
	if ok, _ := b.Exists(ctx, key); ok {
		t.Error("flytekit's oversized document is still where the reader looks")
	}
	if ok, _ := b.Exists(ctx, kferrors.RefinedPrefix+key); !ok {
		t.Errorf("flytekit's document not kept under %s", kferrors.RefinedPrefix)
	}

	r, err := outputreader.Read(ctx, outputreader.NewBucketSource(b), nil)
	if err != nil || r.RootCause == nil {
		t.Fatalf("Read: %v", err)
	}
	if len(r.Skipped) != 0 || r.RootCause.Key != newKey || r.RootCause.Unreadable != nil || r.RootCause.Failure.Worker != "job-worker-1" {
		t.Errorf("reader: root cause %s (%v), skipped %v: want the rewritten document, read", r.RootCause.Key, r.RootCause.Unreadable, r.Skipped)
	}
}
