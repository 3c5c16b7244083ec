package master

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kfelastic/kfelastic/api/masterpb"
)

func kvRecord(k, v string) *masterpb.StateRecord {
	return &masterpb.StateRecord{Record: &masterpb.StateRecord_Kv{Kv: &masterpb.KVRecord{Key: k, Value: []byte(v)}}}
}

// fileState is a file:// state in dir as a master of job "job" with
// token "token" opens it: the state claimed.
func fileState(t *testing.T, dir string) *durableLog {
	t.Helper()
	d, _, err := loadState(t.Context(), stateSpec{bucket: openDir(t, dir), dir: dir, job: "job", token: "token"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	return d
}

// kvs loads the state in dir without claiming it: its keys and seq.
func kvs(t *testing.T, dir string) (map[string]string, uint64) {
	t.Helper()
	d, recs, err := readState(t.Context(), stateSpec{bucket: openDir(t, dir), dir: dir, job: "job", token: "token"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range recs {
		got[r.GetKv().GetKey()] = string(r.GetKv().GetValue())
	}
	return got, d.seq
}

func set(t *testing.T, d *durableLog, k, v string) error {
	t.Helper()
	return d.append(t.Context(), []*masterpb.StateRecord{kvRecord(k, v)})
}

// The newest master wins, and a master answers only while it is the
// newest: once a second master has claimed the state, the first one's
// writes and its held check fail with ErrFenced, and what the first one
// wrote after the claim (never answered) is not part of the state.
func TestSegmentNewestMasterWins(t *testing.T) {
	dir := t.TempDir()
	a := fileState(t, dir)
	for _, v := range []string{"1", "2"} {
		if err := set(t, a, "k", v); err != nil {
			t.Fatal(err)
		}
	}
	b := fileState(t, dir)
	if got, seq := kvs(t, dir); got["k"] != "2" || seq != 2 {
		t.Fatalf("after the second master's claim: %v seq %d", got, seq)
	}
	if err := a.held(t.Context()); !errors.Is(err, ErrFenced) {
		t.Errorf("the first master's held check: %v, want ErrFenced", err)
	}
	if err := set(t, a, "k", "from a, never answered"); !errors.Is(err, ErrFenced) {
		t.Errorf("the first master's write: %v, want ErrFenced", err)
	}
	if err := set(t, b, "b", "1"); err != nil {
		t.Fatal(err)
	}
	if got, seq := kvs(t, dir); got["k"] != "2" || got["b"] != "1" || seq != 3 {
		t.Errorf("state: %v seq %d, want k=2 b=1 at seq 3 (the fenced write left out)", got, seq)
	}
	// The second one compacts: a snapshot, a new segment, the older ones
	// deleted. The first one, still fenced, finds its segment gone.
	all, err := readAll(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	if prune, err := b.snapshot(t.Context(), all); err != nil || prune != nil {
		t.Fatalf("snapshot: %v (prune %v: a file:// state has no batch objects)", err, prune != nil)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "log", "*.seg"))
	if len(segs) != 1 || filepath.Base(segs[0]) != "00000000000000000003.seg" {
		t.Errorf("segments after the snapshot: %v, want only generation 3", segs)
	}
	if err := a.held(t.Context()); !errors.Is(err, ErrFenced) {
		t.Errorf("the first master after its segment was deleted: %v, want ErrFenced", err)
	}
	if err := set(t, b, "b", "2"); err != nil {
		t.Fatal(err)
	}
	if got, seq := kvs(t, dir); got["k"] != "2" || got["b"] != "2" || seq != 4 {
		t.Errorf("after the snapshot: %v seq %d", got, seq)
	}
}

func readAll(t *testing.T, dir string) ([]*masterpb.StateRecord, error) {
	_, recs, err := readState(t.Context(), stateSpec{bucket: openDir(t, dir), dir: dir, job: "job", token: "token"})
	return recs, err
}

// A master killed mid-write leaves a torn frame at its segment's tail: it
// was never answered, and the state loads without it, whatever the tail
// holds.
func TestSegmentTornTail(t *testing.T) {
	for name, tear := range map[string]func(b []byte, last int) []byte{
		"cut in the frame":    func(b []byte, last int) []byte { return b[:last+10] },
		"cut in the header":   func(b []byte, last int) []byte { return b[:last+3] },
		"a byte flipped":      func(b []byte, last int) []byte { b[len(b)-1] ^= 1; return b },
		"garbage after zeros": func(b []byte, last int) []byte { return append(b, 0, 0, 0, 0, 9, 9, 9, 9, 9) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			a := fileState(t, dir)
			for _, v := range []string{"1", "2"} {
				if err := set(t, a, "k", v); err != nil {
					t.Fatal(err)
				}
			}
			last := a.seg.off
			if err := set(t, a, "k", "3"); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, filepath.FromSlash(segKey(a.seg.gen)))
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			data = tear(data[:a.seg.off], int(last))
			if err := os.WriteFile(p, data, 0o600); err != nil {
				t.Fatal(err)
			}
			wantSeq, wantK := uint64(2), "2"
			if name == "garbage after zeros" {
				wantSeq, wantK = 3, "3"
			}
			if got, seq := kvs(t, dir); got["k"] != wantK || seq != wantSeq {
				t.Errorf("loaded %v seq %d, want k=%s at seq %d", got, seq, wantK, wantSeq)
			}
			b := fileState(t, dir)
			if err := set(t, b, "k", "4"); err != nil {
				t.Fatal(err)
			}
			if got, seq := kvs(t, dir); got["k"] != "4" || seq != wantSeq+1 {
				t.Errorf("after the next master's write: %v seq %d", got, seq)
			}
		})
	}
}

// A segment whose master was killed between its claim and its header
// answered nothing: it is skipped, and the next master claims after it.
func TestSegmentWithoutHeaderSkipped(t *testing.T) {
	dir := t.TempDir()
	a := fileState(t, dir)
	if err := set(t, a, "k", "1"); err != nil {
		t.Fatal(err)
	}
	s, err := claimSegment(dir, a.seg.gen+1) // killed right after
	if err != nil {
		t.Fatal(err)
	}
	s.close()
	if err := set(t, a, "k", "after the claim"); !errors.Is(err, ErrFenced) {
		t.Errorf("write after another master's claim: %v, want ErrFenced", err)
	}
	b := fileState(t, dir)
	if b.seg.gen != a.seg.gen+2 {
		t.Errorf("the next master claimed generation %d, want %d", b.seg.gen, a.seg.gen+2)
	}
	if err := set(t, b, "b", "1"); err != nil {
		t.Fatal(err)
	}
	// What the first one wrote after the headerless claim was never
	// answered; it may or may not be in the state (as a write whose answer
	// was lost). Here the next master read it.
	if got, _ := kvs(t, dir); got["b"] != "1" || got["k"] != "after the claim" {
		t.Errorf("state %v", got)
	}
}
