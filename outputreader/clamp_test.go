package outputreader_test

import (
	"strings"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Issue 27, item 3: a pod whose clock runs 5 s ahead dates its document
// after the store received it. A failure cannot have happened after its
// document was written: the object's modification time bounds it, and the
// message says the time was clamped. Read and Summarize agree, also when
// the skewed document is one of ours, named by its (skewed) time.
func TestDocumentTimeIsBoundedByItsWriteTime(t *testing.T) {
	base := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	for _, ours := range []bool{false, true} {
		dir := t.TempDir()
		put := func(f kferrors.Failure, written time.Time) {
			key := "error-" + strings.Repeat("ab", 16) + ".pb"
			if ours {
				key = kferrors.NewKey(f.Time, f.Worker, kferrors.RandomSuffix())
			} else if f.Worker == "job-worker-0" {
				key = "error-" + strings.Repeat("cd", 16) + ".pb"
			}
			writeAt(t, dir, key, encoded(t, f), written)
		}
		// job-worker-1 raised at .100 by the store's clock, stamped 5 s ahead,
		// written at .120; job-worker-0's secondary error at .150.
		put(kferrors.UserError("ValueError", "ValueError: batch 17 has NaN labels", "job-worker-1", base.Add(5100*time.Millisecond)),
			base.Add(120*time.Millisecond))
		put(kferrors.UserError("RuntimeError", "RuntimeError: [gloo] Connection closed by peer", "job-worker-0", base.Add(150*time.Millisecond)),
			base.Add(170*time.Millisecond))
		b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir, false)
		if err != nil {
			t.Fatal(err)
		}
		r, err := outputreader.Read(t.Context(), outputreader.NewBucketSource(b), nil)
		if err != nil || r.RootCause == nil {
			t.Fatalf("Read: %v", err)
		}
		if got := r.RootCause; got.Failure.Worker != "job-worker-1" || !got.Time().Equal(base.Add(120*time.Millisecond)) ||
			got.AtSource != outputreader.TimeFromModifiedClamped {
			t.Errorf("ours=%v: root cause %s at %s (%s), want job-worker-1 at its write time", ours, got.Failure.Worker, got.Time(), got.AtSource)
		}
		want := "[job-worker-1, 2026-11-21T10:00:00.120000000Z (upload time; the document said 2026-11-21T10:00:05.100000000Z, " +
			"after it was written: its pod's clock ran ahead)] ValueError: batch 17 has NaN labels"
		if msg := r.Message(); !strings.HasPrefix(msg, want) {
			t.Errorf("ours=%v: message\n%s\nwant\n%s", ours, msg, want)
		}
		s, err := outputreader.Summarize(t.Context(), outputreader.NewBucketSource(b), nil)
		if err != nil || s.Message() != r.Message() {
			t.Errorf("ours=%v: Summarize %v:\n%s", ours, err, s.Message())
		}
		b.Close()
	}
}

// S3 keeps Last-Modified to the whole second (a file system's coarse clock
// a few ms behind): a document dated within ModifiedResolution after its
// write time is believed, so that two failures of one second, stored with
// the same whole-second time, keep their order. Clamping those dated
// every document on S3 to its second, and tied them again.
func TestDocumentTimeWithinTheStoresResolutionIsKept(t *testing.T) {
	second := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	put := func(key string, f kferrors.Failure) { writeAt(t, dir, key, encoded(t, f), second) }
	// The secondary error's document first in the listing.
	put("error-"+strings.Repeat("ab", 16)+".pb",
		kferrors.UserError("RuntimeError", "RuntimeError: [gloo] Connection closed by peer", "job-worker-0", second.Add(900*time.Millisecond)))
	put("error-"+strings.Repeat("cd", 16)+".pb",
		kferrors.UserError("ValueError", "ValueError: batch 17 has NaN labels", "job-worker-1", second.Add(100*time.Millisecond)))
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
	if err != nil || s.RootCause == nil {
		t.Fatalf("Summarize: %v", err)
	}
	for name, got := range map[string]*outputreader.Document{"Read": r.RootCause, "Summarize": s.RootCause} {
		if got.Failure.Worker != "job-worker-1" || !got.Time().Equal(second.Add(100*time.Millisecond)) ||
			got.AtSource != outputreader.TimeFromDocument {
			t.Errorf("%s: root cause %s at %s (%s), want job-worker-1 at its own time", name, got.Failure.Worker, got.Time(), got.AtSource)
		}
	}
}
