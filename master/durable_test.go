package master

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"gocloud.dev/blob"
	"google.golang.org/protobuf/proto"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
)

func openDir(t *testing.T, dir string) *blob.Bucket {
	t.Helper()
	b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// A job taken through rounds, a failure and a decision comes back equal
// from its records, whether from one snapshot or from the batches.
func TestRestoreJobFromRecords(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := Config{JobID: "j", MinNodes: 2, MaxNodes: 3}
	j, err := NewJob(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := newMerger()
	step := func() { m.add(j.dirtyRecords(j.Ready().Dirty)) }
	for i, pod := range []string{"w0", "w1", "w2"} {
		if _, err := j.Join(NodeInfo{Pod: pod, Incarnation: "1", Rank: i, LocalWorldSize: 2, Addr: "a" + pod, Port: 1000 + i}, 0, t0); err != nil {
			t.Fatal(err)
		}
		step()
	}
	if _, err := j.Leave(NodeInfo{Pod: "w1", Incarnation: "1", Rank: 1, LocalWorldSize: 2}, false,
		kferrors.Failure{Code: "OOMKilled", Recoverable: true}, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	step()
	later := t0.Add(time.Hour)
	fromSnap, err := RestoreJob(cfg, j.allRecords(), later)
	if err != nil {
		t.Fatal(err)
	}
	fromLog, err := RestoreJob(cfg, m.records(), later)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*Job{"snapshot": fromSnap, "log": fromLog} {
		if !reflect.DeepEqual(strip(r.Nodes()), strip(j.Nodes())) {
			t.Errorf("%s: nodes\n%+v\nwant\n%+v", name, r.Nodes(), j.Nodes())
		}
		if r.Latest().Number != 1 || !reflect.DeepEqual(r.Latest().Ranks, []int{0, 1, 2}) {
			t.Errorf("%s: latest round %+v", name, r.Latest())
		}
		if len(r.Decisions()) != 1 || r.Decisions()[0].Reason != "OOMKilled" || r.Decisions()[0].Kind != 2 {
			t.Errorf("%s: decisions %+v", name, r.Decisions())
		}
		// A live node gets a fresh grace: no node is lost just because the
		// master was away.
		r.Tick(later.Add(DefaultHeartbeatTimeout / 2))
		if rd := r.Ready(); len(rd.Dead) != 0 {
			t.Errorf("%s: nodes declared dead right after the restart: %v", name, rd.Dead)
		}
		// The members that were running are still in round 1 and are told
		// to restart (a member is gone).
		if a := r.HeartbeatAnswer(0, 1); a.Action != Restart {
			t.Errorf("%s: rank 0 heartbeat after restore: %v", name, a.Action)
		}
	}
}

// strip drops the times a restore resets (the grace it gives).
func strip(ns []Node) []Node {
	for i := range ns {
		ns[i].JoinedAt, ns[i].LastSeen = time.Time{}, time.Time{}
	}
	return ns
}

func TestDurableLogSnapshotAndReload(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	b := openDir(t, dir)
	d, recs, err := loadState(ctx, b, "job", dir)
	if err != nil || len(recs) != 0 || d.seq != 0 {
		t.Fatalf("empty state: %v %v %d", err, recs, d.seq)
	}
	kv := func(k, v string) *masterpb.StateRecord {
		return &masterpb.StateRecord{Record: &masterpb.StateRecord_Kv{Kv: &masterpb.KVRecord{Key: k, Value: []byte(v)}}}
	}
	for i := range 5 {
		if err := d.append(ctx, []*masterpb.StateRecord{kv("a", string(rune('0'+i))), kv("k"+string(rune('0'+i)), "x")}); err != nil {
			t.Fatal(err)
		}
	}
	// Snapshot at 5, then two more batches.
	_, all, err := loadState(ctx, b, "job", dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.snapshot(ctx, all); err != nil {
		t.Fatal(err)
	}
	if err := d.append(ctx, []*masterpb.StateRecord{kv("a", "latest")}); err != nil {
		t.Fatal(err)
	}
	d2, recs, err := loadState(ctx, b, "job", dir)
	if err != nil {
		t.Fatal(err)
	}
	if d2.seq != 6 {
		t.Errorf("seq after reload %d, want 6", d2.seq)
	}
	got := map[string]string{}
	for _, r := range recs {
		got[r.GetKv().GetKey()] = string(r.GetKv().GetValue())
	}
	if got["a"] != "latest" || len(got) != 6 {
		t.Errorf("reloaded %v", got)
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "log", "*.pb"))
	snaps, _ := filepath.Glob(filepath.Join(dir, "snap", "*.pb"))
	if len(logs) != 1 || len(snaps) != 1 {
		t.Errorf("after the snapshot: logs %v, snapshots %v", logs, snaps)
	}
	// A second master that loaded the same state cannot write the same seq.
	if err := d.append(ctx, []*masterpb.StateRecord{kv("b", "1")}); err != nil {
		t.Fatal(err)
	}
	if err := d2.append(ctx, []*masterpb.StateRecord{kv("b", "2")}); !errors.Is(err, ErrFenced) {
		t.Errorf("second writer of seq 7: %v, want ErrFenced", err)
	}
}

// A corrupt object, another job's state, an unknown format, a gap: a clear
// error naming the object, and nothing changed.
func TestBadStateRefused(t *testing.T) {
	ctx := t.Context()
	write := func(t *testing.T, dir, key string, data []byte) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(key))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	file := func(job string, format int32, seq uint64) []byte {
		b, _ := proto.Marshal(&masterpb.StateFile{Format: format, Job: job, Seq: seq})
		return b
	}
	for name, files := range map[string]map[string][]byte{
		"corrupt":    {"log/00000000000000000001.pb": []byte("\xff\xff\xff not a proto")},
		"other job":  {"log/00000000000000000001.pb": file("someone-else", 1, 1)},
		"new format": {"log/00000000000000000001.pb": file("job", 99, 1)},
		"gap":        {"log/00000000000000000001.pb": file("job", 1, 1), "log/00000000000000000003.pb": file("job", 1, 3)},
		"wrong seq":  {"log/00000000000000000001.pb": file("job", 1, 7)},
		"bad snap":   {"snap/00000000000000000004.pb": []byte{0x0a}},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for k, v := range files {
				write(t, dir, k, v)
			}
			before, _ := os.ReadDir(filepath.Join(dir, "log"))
			_, _, err := loadState(ctx, openDir(t, dir), "job", dir)
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("load: %v, want ErrBadState", err)
			}
			t.Log(err)
			after, _ := os.ReadDir(filepath.Join(dir, "log"))
			if len(before) != len(after) {
				t.Errorf("the state was changed: %d → %d log objects", len(before), len(after))
			}
		})
	}
}

func TestRestoreRefusesBadRecords(t *testing.T) {
	cfg := Config{JobID: "j", MinNodes: 1, MaxNodes: 2}
	for name, r := range map[string]*masterpb.StateRecord{
		"rank out of range": {Record: &masterpb.StateRecord_Node{Node: &masterpb.NodeRecord{Rank: 7, Pod: "p", State: "running"}}},
		"unknown state":     {Record: &masterpb.StateRecord_Node{Node: &masterpb.NodeRecord{Rank: 0, Pod: "p", State: "zombie"}}},
		"ragged round":      {Record: &masterpb.StateRecord_Round{Round: &masterpb.RoundRecord{Number: 1, Ranks: []int32{0, 1}}}},
	} {
		if _, err := RestoreJob(cfg, []*masterpb.StateRecord{r}, time.Now()); !errors.Is(err, ErrBadState) {
			t.Errorf("%s: %v, want ErrBadState", name, err)
		}
	}
	_ = context.Background
}
