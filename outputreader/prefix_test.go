package outputreader_test

import (
	"context"
	goerrors "errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
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
	b, err := kferrors.OpenPrefix(ctx, "file://"+dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
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
		go func() {
			defer close(done)
			r, err = outputreader.Read(ctx, outputreader.NewBucketSource(b), &outputreader.Options{OpenAll: true})
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Read blocked", prefix)
		}
		b.Close()
		if err != nil {
			t.Fatalf("%s: Read failed for bad entries: %v", prefix, err)
		}
		if r.RootCause == nil || r.RootCause.Key != first || len(r.Others) != 1 || r.Others[0].Key != second {
			t.Fatalf("%s: root %+v, others %+v", prefix, r.RootCause, r.Others)
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
