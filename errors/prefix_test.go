package errors_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/outputreader"
)

// A file:// prefix on another file system than os.TempDir() (a tmpfs /tmp
// and the outputs on disk, or the reverse) gets its documents and events:
// nothing is written in os.TempDir() and renamed across file systems
// (EXDEV), and moving recovered documents to superseded/ works too.
func TestFilePrefixOnAnotherFileSystem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other := testenv.OtherFileSystem(t, 16<<20)
	t.Setenv("TMPDIR", t.TempDir())
	var a, b syscall.Stat_t
	if err := syscall.Stat(other, &a); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(os.TempDir(), &b); err != nil {
		t.Fatal(err)
	}
	if a.Dev == b.Dev {
		t.Fatalf("%s and os.TempDir() %s are on the same file system", other, os.TempDir())
	}
	prefix := filepath.Join(other, "run", "attempt-0")
	bucket, err := kferrors.OpenPrefix(ctx, "file://"+prefix, true)
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	w := kferrors.NewWriter(bucket, nil)
	early, err := w.Write(ctx, kferrors.UserError("ValueError", "first", "pod-0", time.Now().Add(-time.Minute)))
	if err != nil {
		t.Fatalf("write a document: %v", err)
	}
	if _, err := w.Write(ctx, kferrors.UserError("RuntimeError", "second", "pod-1", time.Now())); err != nil {
		t.Fatalf("write a document: %v", err)
	}
	if _, err := events.NewWriter(bucket).Append(ctx, events.Event{Time: time.Now(), Pod: "pod-0", Kind: events.GroupStarted}); err != nil {
		t.Fatalf("append an event: %v", err)
	}
	moved, err := kferrors.Supersede(ctx, bucket, "pod-0", time.Now())
	if err != nil || len(moved) != 1 {
		t.Fatalf("supersede: %v %v", moved, err)
	}
	// What a write killed halfway leaves (fileblob's temporary name) is
	// neither read nor reported.
	for _, partial := range []string{"error-1795642233197218325-pod-0-95682dad7b8b41f0.pb.18eb6726e5b3ab03.tmp", "events/x.json.18eb6726e5b3ab03.tmp"} {
		if err := os.WriteFile(filepath.Join(prefix, partial), []byte("half"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, err := outputreader.Read(ctx, outputreader.NewBucketSource(bucket), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.RootCause == nil || res.RootCause.Failure.Code != "RuntimeError" || len(res.Others) != 0 || len(res.Skipped) != 0 {
		t.Errorf("documents after pod-0's were superseded: %+v", res)
	}
	log, err := events.Read(ctx, bucket, nil)
	if err != nil || len(log.Events) != 1 || len(log.Skipped) != 0 {
		t.Errorf("events: %+v %v", log, err)
	}
	if _, err := os.Stat(filepath.Join(prefix, "superseded", early)); err != nil {
		t.Errorf("superseded document: %v", err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(os.TempDir(), "*"))
	if len(leftovers) != 0 {
		t.Errorf("files left in os.TempDir(): %v", leftovers)
	}
}

// A file URL whose meaning depends on how it is read is refused, before
// anything is written anywhere: file://name/x reads "name" as a host (and
// would write /x), file:x and file://./x depend on the current folder.
func TestFileURLMustBeAbsolute(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	t.Chdir(dir)
	for _, bad := range []string{"file://stateA", "file://stateA/errs", "file:stateA", "file:./stateA", "file://./stateA", "file://", "file:", "file://host" + dir, "file://" + dir + "/a#1"} {
		err := kferrors.CheckURL(bad)
		if err == nil {
			t.Errorf("CheckURL(%q): want an error", bad)
			continue
		}
		if !strings.Contains(err.Error(), "file:///") {
			t.Errorf("CheckURL(%q) = %v: does not say what to write instead", bad, err)
		}
		if b, err := kferrors.OpenPrefix(ctx, bad, true); err == nil {
			b.Close()
			t.Errorf("OpenPrefix(%q): want an error", bad)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused URLs created %v in the current folder", entries)
	}
	if _, err := os.Stat("/stateA"); err == nil {
		t.Errorf("/stateA exists")
	}
	for _, good := range []string{"file://" + dir + "/a", "file://localhost" + dir + "/b", "mem://", "s3://bucket/prefix?region=us-east-1"} {
		if err := kferrors.CheckURL(good); err != nil {
			t.Errorf("CheckURL(%q): %v", good, err)
		}
	}
	b, err := kferrors.OpenPrefix(ctx, "file://localhost"+dir+"/b", true)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := os.Stat(filepath.Join(dir, "b")); err != nil {
		t.Errorf("file://localhost/…: %v", err)
	}
}

// FileURL escapes what a path may hold and a URL may not: the folder
// written is the folder named.
func TestFileURL(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	for _, name := range []string{"a#1", "a?b=c", "50%", "with space", "ünï"} {
		dir := filepath.Join(base, name, "errors")
		u, err := kferrors.FileURL(dir)
		if err != nil {
			t.Fatal(err)
		}
		b, err := kferrors.OpenPrefix(ctx, u, true)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if _, err := kferrors.NewWriter(b, nil).Write(ctx, kferrors.UserError("E", "m", "p", time.Now())); err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		b.Close()
		if docs := files(t, dir, "error-*.pb"); len(docs) != 1 {
			t.Errorf("%s: documents in %s: %v", u, dir, docs)
		}
	}
	entries, _ := os.ReadDir(base)
	if len(entries) != 5 {
		t.Errorf("folders written: %v", entries)
	}
	t.Chdir(base)
	u, err := kferrors.FileURL("rel")
	if err != nil || u != "file://"+filepath.Join(base, "rel") {
		t.Errorf("FileURL(rel) = %q, %v", u, err)
	}
}

func files(t *testing.T, dir, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
