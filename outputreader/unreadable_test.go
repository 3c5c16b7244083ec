package outputreader_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Issue 27: an unreadable document is a failure of its pod, ranked by its
// write time, an upper bound of that failure. A readable document's
// exception earlier than that write time wins; an unreadable document
// written before any other failure happened wins, and says what could be
// read of it. Read and Summarize agree, and the pod counts as reported.
func TestUnreadableDocumentIsItsPodsFailure(t *testing.T) {
	base := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	huge := kferrors.UserError("USER:RuntimeError", "Trace:\n\n    Traceback (most recent call last):\n"+strings.Repeat("    frame\n", 200_000),
		"job-worker-1", base)
	hugeData, err := kferrors.Encode(huge.Document(len(huge.Message)))
	if err != nil {
		t.Fatal(err)
	}
	gloo, err := kferrors.Encode(kferrors.UserError("RuntimeError", "RuntimeError: [gloo] Connection closed by peer", "job-worker-0",
		base.Add(150*time.Millisecond)).Document(0))
	if err != nil {
		t.Fatal(err)
	}
	corruptKey := kferrors.NewKey(base.Add(100*time.Millisecond), "job-worker-2/1", "00000000000000c1")
	for _, c := range []struct {
		name        string
		key         string
		data        []byte
		written     time.Duration // the unreadable document's write time, after base
		wantRoot    string        // worker
		wantWorker  string        // the unreadable document's
		wantMessage []string
	}{
		{"oversized, written before the peer failed: it wins", "error-" + strings.Repeat("ab", 16) + ".pb", hugeData, 120 * time.Millisecond,
			"", "", []string{"could not be read: error document too large: " + strconv.Itoa(len(hugeData)) + " bytes, limit 1048576.",
				`code "USER:RuntimeError"`, "Its message began:\n\nTrace:\n\n    Traceback (most recent call last):"}},
		{"oversized, written after the peer failed: the peer's exception wins", "error-" + strings.Repeat("ab", 16) + ".pb", hugeData, 170 * time.Millisecond,
			"job-worker-0", "", nil},
		{"ours, corrupt, names its pod", corruptKey, []byte("not a protobuf \x00\x01"), 130 * time.Millisecond,
			"job-worker-2.1", "job-worker-2.1", []string{"error document " + corruptKey + " (17 bytes) could not be read: corrupt error document"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeAt(t, dir, "error-"+strings.Repeat("cd", 16)+".pb", gloo, base.Add(160*time.Millisecond))
			writeAt(t, dir, c.key, c.data, base.Add(c.written))
			b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir, false)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			r, err := outputreader.Read(t.Context(), outputreader.NewBucketSource(b), nil)
			if err != nil || r.RootCause == nil {
				t.Fatalf("Read: %v", err)
			}
			s, err := outputreader.Summarize(t.Context(), outputreader.NewBucketSource(b), nil)
			if err != nil {
				t.Fatal(err)
			}
			sameSummary(t, r, s)
			if len(r.Skipped) != 1 || r.Skipped[0].Key != c.key || s.Skipped != 1 || s.Documents() != 2 {
				t.Fatalf("skipped %v (%d), %d documents: want the unreadable one skipped and counted as a failure", r.Skipped, s.Skipped, s.Documents())
			}
			un := r.RootCause
			if un.Unreadable == nil {
				un = &r.Others[0]
			}
			if un.Key != c.key || un.Unreadable == nil || un.AtSource != outputreader.TimeFromModified || !un.At.Equal(base.Add(c.written)) ||
				un.Failure.Code != kferrors.CodeUnreadableDocument || un.Failure.Worker != c.wantWorker {
				t.Fatalf("unreadable document's failure: %+v", un)
			}
			if c.wantRoot == "" {
				if r.RootCause.Key != c.key {
					t.Fatalf("root cause %s, want the unreadable document", r.RootCause.Key)
				}
			} else if r.RootCause.Failure.Worker != c.wantRoot {
				t.Fatalf("root cause %s (%s), want %s", r.RootCause.Failure.Worker, r.RootCause.Key, c.wantRoot)
			}
			if r.RootCause.Key == c.key {
				msg := r.Message()
				for _, want := range c.wantMessage {
					if !strings.Contains(msg, want) {
						t.Errorf("message lacks %q:\n%s", want, msg)
					}
				}
				if !strings.Contains(msg, "(upload time)") || !strings.Contains(msg, "Also failed: 1 other worker (1× RuntimeError).") ||
					strings.Contains(msg, "Skipped") {
					t.Errorf("message:\n%s", msg)
				}
			}
			if c.wantWorker != "" && !s.HasPod("job-worker-2") {
				t.Error("the pod that wrote the unreadable document has not reported")
			}
		})
	}
}

// writeAt writes data as dir/key, its modification time at: the store's
// write time the reader sees.
func writeAt(t *testing.T, dir, key string, data []byte, at time.Time) {
	t.Helper()
	p := filepath.Join(dir, key)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, at, at); err != nil {
		t.Fatal(err)
	}
}

// encoded is f's document, encoded.
func encoded(t *testing.T, f kferrors.Failure) []byte {
	t.Helper()
	data, err := kferrors.Encode(f.Document(0))
	if err != nil {
		t.Fatal(err)
	}
	return data
}
