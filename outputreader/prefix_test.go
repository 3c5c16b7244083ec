package outputreader_test

import (
	"context"
	goerrors "errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/outputreader"
)

// A file:// prefix with what a careless or hostile user leaves there: links
// (a loop, dangling, out of the prefix, inside it), a FIFO, a folder. Each
// bad entry is skipped and reported, never followed, never a failed read,
// and a prefix that is itself a link reads as the folder it leads to.
func TestFilePrefixBadEntriesAreSkipped(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	dir := filepath.Join(root, "attempt-0")
	b := testenv.FilePrefix(t, dir)
	w := kferrors.NewWriter(b, nil)
	first, _ := w.Write(ctx, kferrors.UserError("ValueError", "first", "job-worker-1", t0))
	second, _ := w.Write(ctx, kferrors.UserError("DistNetworkError", "peer gone", "job-worker-0", t0.Add(time.Second)))
	// A document outside the prefix, earlier than every other: a link to it
	// must not make it the root cause.
	outside := filepath.Join(root, "secret")
	os.Mkdir(outside, 0o755)
	secret, _ := kferrors.Encode(kferrors.UserError("Secret", "outside the prefix", "intruder", t0.Add(-time.Hour)).Document(0))
	os.WriteFile(filepath.Join(outside, "error-secret.pb"), secret, 0o600)

	links := map[string]string{
		"error-loop.pb":     "error-loop.pb",
		"error-loop-a.pb":   "error-loop-b.pb",
		"error-loop-b.pb":   "error-loop-a.pb",
		"error-dangling.pb": "/nonexistent/error.pb",
		"error-outside.pb":  filepath.Join(outside, "error-secret.pb"),
		"error-up.pb":       "../secret/error-secret.pb",
		"error-inside.pb":   first,
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "error-fifo.pb"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "error-folder.pb"), 0o755)
	link := filepath.Join(root, "prefix-link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}

	for _, prefix := range []string{dir, link} {
		b, err := kferrors.OpenPrefix(ctx, "file://"+prefix, false)
		if err != nil {
			t.Fatalf("%s: %v", prefix, err)
		}
		done := make(chan struct{})
		var r *outputreader.Report
		var sum *outputreader.Summary
		var sumErr error
		go func() {
			defer close(done)
			r, err = outputreader.Read(ctx, outputreader.NewBucketSource(b), &outputreader.Options{OpenAll: true})
			sum, sumErr = outputreader.Summarize(ctx, outputreader.NewBucketSource(b), nil)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Read blocked", prefix)
		}
		b.Close()
		if err != nil || sumErr != nil {
			t.Fatalf("%s: Read or Summarize failed for bad entries: %v, %v", prefix, err, sumErr)
		}
		sameSummary(t, r, sum)
		for _, s := range sum.SkippedSample {
			if !goerrors.Is(s.Err, outputreader.ErrUnreadable) {
				t.Errorf("%s: Summarize skipped %s: %v", prefix, s.Key, s.Err)
			}
		}
		// Each bad entry is a failure too (a pod may have written it), ranked
		// by its write time, after the documents' own failures.
		if r.RootCause == nil || r.RootCause.Key != first || len(r.Others) != 1+len(r.Skipped) || r.Others[0].Key != second {
			t.Fatalf("%s: root %+v, others %+v", prefix, r.RootCause, r.Others)
		}
		for _, d := range r.Others[1:] {
			if d.Unreadable == nil || d.Failure.Code != kferrors.CodeUnreadableDocument || strings.Contains(d.Failure.Message, "outside the prefix") {
				t.Errorf("%s: %s: %+v", prefix, d.Key, d)
			}
		}
		want := map[string]bool{"error-fifo.pb": true}
		for name := range links {
			want[name] = true
		}
		for _, s := range r.Skipped {
			if !want[s.Key] || !goerrors.Is(s.Err, outputreader.ErrUnreadable) {
				t.Errorf("%s: skipped %s: %v", prefix, s.Key, s.Err)
			}
			delete(want, s.Key)
		}
		if len(want) != 0 {
			t.Errorf("%s: not reported: %v (skipped %v)", prefix, want, r.Skipped)
		}
	}

	// A prefix that is a file, or missing, is refused clearly, not listed as empty.
	for _, bad := range []string{filepath.Join(outside, "error-secret.pb"), filepath.Join(root, "missing")} {
		if b, err := kferrors.OpenPrefix(ctx, "file://"+bad, false); err == nil {
			b.Close()
			t.Errorf("%s: opened", bad)
		}
	}
}

// An object's modification time stands in for a missing timestamp only if
// it is usable: a file dated 1970 (touch -d @0) ranks by the listing time,
// not as the root cause; so does a synthesized failure dated 1970.
func TestModificationTimeOf1970IsNotUsed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b := testenv.FilePrefix(t, dir)
	root, _ := kferrors.NewWriter(b, nil).Write(ctx, kferrors.UserError("ValueError", "first", "job-worker-1", t0))
	untimed, _ := kferrors.Encode(kferrors.UserError("OldError", "legacy", "", time.Time{}).Document(0))
	os.WriteFile(filepath.Join(dir, kferrors.LegacyKey), untimed, 0o644)
	if err := os.Chtimes(filepath.Join(dir, kferrors.LegacyKey), time.Unix(0, 0), time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	synthesized := kferrors.SystemFailure(kferrors.CodeOOMKilled, "pod OOMKilled", "job-worker-2", time.Unix(1, 0))
	r, err := outputreader.Read(ctx, outputreader.NewBucketSource(b), nil, synthesized)
	if err != nil {
		t.Fatal(err)
	}
	if r.RootCause == nil || r.RootCause.Key != root || len(r.Others) != 2 {
		t.Fatalf("root %+v, others %+v", r.RootCause, r.Others)
	}
	for _, d := range r.Others {
		if d.AtSource != outputreader.TimeFromListing || d.At.Before(t0) {
			t.Errorf("%s (%s) ranked at %v (%s)", d.Key, d.Failure.Code, d.At, d.AtSource)
		}
	}
	// The plugin's read agrees, the failure passed to Summarize or merged
	// after it (as the plugin merges the pods it synthesizes).
	sum, err := outputreader.Summarize(ctx, outputreader.NewBucketSource(b), nil, synthesized)
	if err != nil {
		t.Fatal(err)
	}
	sameSummary(t, r, sum)
	sum, err = outputreader.Summarize(ctx, outputreader.NewBucketSource(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	if merged := sum.Merge(synthesized); merged.RootCause == nil || merged.RootCause.Key != root || merged.Message() != r.Message() {
		t.Errorf("merged: root %+v, message %q, want %q", merged.RootCause, merged.Message(), r.Message())
	}
}
