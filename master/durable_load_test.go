package master

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
)

// writeLogs writes n batches (kv "k" = i) into a fresh state in dir as
// one object per batch (log/<seq>.pb): as a master writes them on other
// stores than file://, and did on file:// before log segments.
func writeLogs(t *testing.T, dir string, n int) {
	t.Helper()
	d, _, err := loadState(t.Context(), stateSpec{bucket: openDir(t, dir), job: "job", private: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		rec := &masterpb.StateRecord{Record: &masterpb.StateRecord_Kv{Kv: &masterpb.KVRecord{Key: "k", Value: []byte{byte('0' + i)}}}}
		if err := d.append(t.Context(), []*masterpb.StateRecord{rec}); err != nil {
			t.Fatal(err)
		}
	}
}

func moveAway(t *testing.T, dir string, seqs ...uint64) {
	t.Helper()
	aside := t.TempDir()
	for _, s := range seqs {
		k := seqKey(logDir, s)
		if err := os.Rename(filepath.Join(dir, k), filepath.Join(aside, filepath.Base(k))); err != nil {
			t.Fatal(err)
		}
	}
}

// A corrupt log's message says what gets the master going, and doing so
// does: the last log alone can be moved away; a corrupt log with later
// ones needs those moved too (moving it alone leaves a gap, refused).
func TestCorruptLogAdviceWorks(t *testing.T) {
	ctx := t.Context()
	corrupt := func(t *testing.T, dir string, seq uint64) {
		if err := os.WriteFile(filepath.Join(dir, seqKey(logDir, seq)), []byte("\xff\xff not a proto"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("last log", func(t *testing.T) {
		dir := t.TempDir()
		writeLogs(t, dir, 5)
		corrupt(t, dir, 5)
		_, _, err := loadState(ctx, stateSpec{bucket: openDir(t, dir), job: "job", dir: dir})
		if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), "it is the last log: move it away") {
			t.Fatalf("load: %v", err)
		}
		moveAway(t, dir, 5)
		d, recs, err := loadState(ctx, stateSpec{bucket: openDir(t, dir), job: "job", dir: dir})
		if err != nil || d.seq != 4 || string(recs[0].GetKv().GetValue()) != "4" {
			t.Fatalf("after moving it away: seq %v, %v", d, err)
		}
	})
	t.Run("later logs", func(t *testing.T) {
		dir := t.TempDir()
		writeLogs(t, dir, 5)
		corrupt(t, dir, 3)
		_, _, err := loadState(ctx, stateSpec{bucket: openDir(t, dir), job: "job", dir: dir})
		want := "2 later logs (to log/00000000000000000005.pb) build on it: move it and every later log away"
		if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), want) {
			t.Fatalf("load: %v\nwant it to say %q", err, want)
		}
		t.Log(err)
		moveAway(t, dir, 3)
		if _, _, err := loadState(ctx, stateSpec{bucket: openDir(t, dir), job: "job", dir: dir}); err == nil || !strings.Contains(err.Error(), "gap") {
			t.Fatalf("with only the corrupt log moved: %v, want the gap refused", err)
		}
		moveAway(t, dir, 4, 5)
		d, recs, err := loadState(ctx, stateSpec{bucket: openDir(t, dir), job: "job", dir: dir})
		if err != nil || d.seq != 2 || string(recs[0].GetKv().GetValue()) != "2" {
			t.Fatalf("after moving it and the later logs away: %v, %v", d, err)
		}
	})
	t.Run("snapshot", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "snap"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, seqKey(snapDir, 9)), []byte{0x0a}, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := loadState(ctx, stateSpec{bucket: openDir(t, dir), job: "job", dir: dir})
		if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), "cannot be rebuilt without it") {
			t.Fatalf("load: %v", err)
		}
	})
}

// A folder (or anything not a regular file) named like a state file is
// refused at load, not skipped: skipped, the master started and then
// called its first write of that seq a fence.
func TestStateEntryNotAFileRefused(t *testing.T) {
	for _, name := range []string{"log/00000000000000000003.pb", "snap/00000000000000000003.pb", "log/00000000000000000001.seg"} {
		dir := t.TempDir()
		writeLogs(t, dir, 2)
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		_, _, err := loadState(t.Context(), stateSpec{bucket: openDir(t, dir), job: "job", dir: dir})
		if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("%s: load: %v", p, err)
		}
	}
}

// The temporary files of writes a SIGKILLed master left in log/ and snap/
// are removed when a master loads the state; the state files stay.
func TestLeftTemporaryFilesRemoved(t *testing.T) {
	dir := t.TempDir()
	writeLogs(t, dir, 2)
	for _, p := range []string{"log/.tmp-123", "snap/.tmp-456"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte("half a batch"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, _, err := loadState(t.Context(), stateSpec{bucket: openDir(t, dir), job: "job", dir: dir})
	if err != nil || d.seq != 2 {
		t.Fatalf("load: %v %v", d, err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*", ".tmp-*"))
	logs, _ := filepath.Glob(filepath.Join(dir, "log", "*.pb"))
	if len(left) != 0 || len(logs) != 2 {
		t.Errorf("after load: temporary %v, logs %v", left, logs)
	}
}

// BenchmarkDurableAppend is one batch of one small record written to a
// file:// state in KFELASTIC_BENCH_DIR (default: the test's temporary
// folder): what group commit pays once per batch.
func BenchmarkDurableAppend(b *testing.B) {
	dir := b.TempDir()
	if d := os.Getenv("KFELASTIC_BENCH_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "bench-append-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	bucket, err := kferrors.OpenPrefix(b.Context(), "file://"+dir, true)
	if err != nil {
		b.Fatal(err)
	}
	defer bucket.Close()
	d, _, err := loadState(b.Context(), stateSpec{bucket: bucket, job: "job", dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	rec := []*masterpb.StateRecord{{Record: &masterpb.StateRecord_Kv{Kv: &masterpb.KVRecord{Key: "k", Value: []byte("value")}}}}
	for b.Loop() {
		if err := d.append(b.Context(), rec); err != nil {
			b.Fatal(err)
		}
	}
}
