package master

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"gocloud.dev/blob"
	"google.golang.org/protobuf/proto"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
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
	for name, r := range restoreBoth(t, cfg, j, m, later) {
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
		if a := r.HeartbeatAnswer("w0", "1", 0, 1); a.Action != Restart {
			t.Errorf("%s: rank 0 heartbeat after restore: %v", name, a.Action)
		}
	}
}

// sameRestored fails t unless got has want's nodes and claims, less the
// times a restore resets.
func sameRestored(t testing.TB, want, got *Job) {
	t.Helper()
	if !reflect.DeepEqual(strip(got.Nodes()), strip(want.Nodes())) {
		t.Fatalf("restored nodes differ:\n%+v\nwant\n%+v", got.Nodes(), want.Nodes())
	}
	if g, w := claimsOf(got), claimsOf(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("restored claims differ:\n%+v\nwant\n%+v", g, w)
	}
	if g, w := fencesOf(got), fencesOf(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("restored fences differ:\n%v\nwant\n%v", g, w)
	}
}

// fencesOf is j's fenced incarnations, by rank, where there are any.
func fencesOf(j *Job) map[int][]string {
	out := map[int][]string{}
	for r, f := range j.fenced {
		if len(f) > 0 {
			out[r] = f
		}
	}
	return out
}

// claimsOf is j's claims less their times.
func claimsOf(j *Job) map[int]claim {
	out := map[int]claim{}
	for r, c := range j.claims {
		out[r] = claim{n: c.n, afterRound: c.afterRound, expired: c.expired}
	}
	return out
}

// strip drops the times a restore resets (the grace it gives).
func strip(ns []Node) []Node {
	for i := range ns {
		ns[i].JoinedAt, ns[i].LastSeen, ns[i].LastCall = time.Time{}, time.Time{}, time.Time{}
	}
	return ns
}

// Batches, a snapshot and batches after it reload as they were written,
// on file:// (log segments) and on other stores (an object per batch),
// and a second master's load fences the first.
func TestDurableLogSnapshotAndReload(t *testing.T) {
	for _, kind := range []string{"file", "objects"} {
		t.Run(kind, func(t *testing.T) {
			ctx := t.Context()
			dir := t.TempDir()
			st := stateSpec{bucket: openDir(t, dir), job: "job", token: "token"}
			if kind == "file" {
				st.dir = dir
			}
			d, recs, err := loadState(ctx, st)
			if err != nil || len(recs) != 0 {
				t.Fatalf("empty state: %v %v", err, recs)
			}
			defer d.close()
			for i := range 5 {
				if err := d.append(ctx, []*masterpb.StateRecord{kvRecord("a", string(rune('0'+i))), kvRecord("k"+string(rune('0'+i)), "x")}); err != nil {
					t.Fatal(err)
				}
			}
			// Snapshot, then one more batch.
			_, all, err := readState(ctx, st)
			if err != nil {
				t.Fatal(err)
			}
			before, _ := filepath.Glob(filepath.Join(dir, "log", "*"))
			prune, err := d.snapshot(ctx, all)
			if err != nil {
				t.Fatal(err)
			}
			// The batches an object store holds one per object are the
			// prune's, run off the loop; the segment goes at once.
			if (prune != nil) != (kind == "objects") {
				t.Fatalf("%s: prune %v", kind, prune != nil)
			}
			if prune != nil {
				if logs, _ := filepath.Glob(filepath.Join(dir, "log", "*")); len(logs) != len(before) {
					t.Errorf("batches before the prune: %v, want those of before the snapshot, %v", logs, before)
				}
				if err := prune(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.append(ctx, []*masterpb.StateRecord{kvRecord("a", "latest")}); err != nil {
				t.Fatal(err)
			}
			seq := d.seq
			d2, recs, err := loadState(ctx, st)
			if err != nil {
				t.Fatal(err)
			}
			defer d2.close()
			if d2.seq < seq {
				t.Errorf("seq after reload %d, want at least %d", d2.seq, seq)
			}
			got := map[string]string{}
			for _, r := range recs {
				got[r.GetKv().GetKey()] = string(r.GetKv().GetValue())
			}
			if got["a"] != "latest" || len(got) != 6 {
				t.Errorf("reloaded %v", got)
			}
			snaps, _ := filepath.Glob(filepath.Join(dir, "snap", "*.pb"))
			logs, _ := filepath.Glob(filepath.Join(dir, "log", "*"))
			// file: the first master's segment since its snapshot, the
			// second's; objects: the batch after the snapshot, the second
			// master's claim.
			if len(logs) != 2 || len(snaps) != 1 {
				t.Errorf("after the snapshot: logs %v, snapshots %v", logs, snaps)
			}
			// The first master, fenced by the second's load, writes nothing
			// more; the second goes on.
			if err := d.append(ctx, []*masterpb.StateRecord{kvRecord("b", "1")}); !errors.Is(err, ErrFenced) {
				t.Errorf("the first master after the second loaded: %v, want ErrFenced", err)
			}
			if err := d2.append(ctx, []*masterpb.StateRecord{kvRecord("b", "2")}); err != nil {
				t.Errorf("the second master: %v", err)
			}
		})
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
	other := tokenFingerprint("another job's token")
	snapOf := func(fingerprint []byte) []byte {
		b, _ := proto.Marshal(&masterpb.StateFile{Format: 1, Job: "job", Seq: 4, Snapshot: true, TokenFingerprint: fingerprint})
		return b
	}
	// seg is a segment: its header (base, job, fingerprint), then batches
	// from base+1, then whatever tail.
	seg := func(gen, base uint64, job string, fingerprint []byte, batches int, tail ...byte) []byte {
		var out []byte
		for i := 0; i <= batches; i++ {
			f := &masterpb.StateFile{Format: 1, Job: job, Seq: base + uint64(i)}
			if i == 0 {
				f.Segment, f.TokenFingerprint = gen, fingerprint
			}
			frame, _ := proto.MarshalOptions{}.MarshalAppend(make([]byte, frameHeaderLen), f)
			putFrameHeader(frame)
			out = append(out, frame...)
		}
		return append(out, tail...)
	}
	mine := tokenFingerprint("token")
	for name, files := range map[string]map[string][]byte{
		"corrupt":                {"log/00000000000000000001.pb": []byte("\xff\xff\xff not a proto")},
		"other job":              {"log/00000000000000000001.pb": file("someone-else", 1, 1)},
		"new format":             {"log/00000000000000000001.pb": file("job", 99, 1)},
		"gap":                    {"log/00000000000000000001.pb": file("job", 1, 1), "log/00000000000000000003.pb": file("job", 1, 3)},
		"wrong seq":              {"log/00000000000000000001.pb": file("job", 1, 7)},
		"bad snap":               {"snap/00000000000000000004.pb": []byte{0x0a}},
		"other token's snapshot": {"snap/00000000000000000004.pb": snapOf(other)},
		"other token's segment":  {"log/00000000000000000001.seg": seg(1, 0, "job", other, 2)},
		"other job's segment":    {"log/00000000000000000001.seg": seg(1, 0, "someone-else", nil, 2)},
		"segment gap": {"log/00000000000000000001.seg": seg(1, 0, "job", mine, 2),
			"log/00000000000000000002.seg": seg(2, 5, "job", mine, 1)},
		"segment torn before the next one's base": {"log/00000000000000000001.seg": seg(1, 0, "job", mine, 2, 9, 9, 9, 9, 9, 9, 9, 9, 9),
			"log/00000000000000000002.seg": seg(2, 3, "job", mine, 1)},
		"segment header wrong": {"log/00000000000000000001.seg": seg(7, 0, "job", mine, 2)},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for k, v := range files {
				write(t, dir, k, v)
			}
			before, _ := os.ReadDir(filepath.Join(dir, "log"))
			_, _, err := loadState(ctx, stateSpec{bucket: openDir(t, dir), job: "job", dir: dir, token: "token"})
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
		"claim's rank out of range": {Record: &masterpb.StateRecord_Claim{Claim: &masterpb.ClaimRecord{Rank: 2, Pod: "p", Incarnation: "1",
			LocalWorldSize: 1}}},
		"ended claim's rank out of range": {Record: &masterpb.StateRecord_Claim{Claim: &masterpb.ClaimRecord{Rank: -1, Ended: true}}},
		"claim without a pod":             {Record: &masterpb.StateRecord_Claim{Claim: &masterpb.ClaimRecord{Rank: 0, Incarnation: "1", LocalWorldSize: 1}}},
		"claim without workers":           {Record: &masterpb.StateRecord_Claim{Claim: &masterpb.ClaimRecord{Rank: 0, Pod: "p", Incarnation: "1"}}},
	} {
		if _, err := RestoreJob(cfg, []*masterpb.StateRecord{r}, time.Now()); !errors.Is(err, ErrBadState) {
			t.Errorf("%s: %v, want ErrBadState", name, err)
		}
	}
	_ = context.Background
}

// A replacement waiting for its rank (a claim: the old pod still holds it)
// keeps its claim across a master restart, whether the master reloads the
// batches or a snapshot: its heartbeat is not answered EXIT, and when the
// old pod leaves it takes the rank over.
func TestRestoreKeepsClaim(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := Config{JobID: "j", MinNodes: 2, MaxNodes: 2, PendTimeout: time.Minute}
	pod := func(name string, rank int) NodeInfo {
		return NodeInfo{Pod: name, Incarnation: "1", Rank: rank, LocalWorldSize: 1, Addr: "a" + name, Port: 1000 + rank}
	}
	w0, w1, w1b := pod("w0", 0), pod("w1", 1), pod("w1b", 1)
	j, err := NewJob(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := newMerger()
	step := func() { m.add(j.dirtyRecords(j.Ready().Dirty)) }
	for _, n := range []NodeInfo{w0, w1} {
		if _, err := j.Join(n, 0, t0); err != nil {
			t.Fatal(err)
		}
		step()
	}
	if a, err := j.Join(w1b, 0, t0.Add(time.Second)); err != nil || !a.Pending() {
		t.Fatalf("the replacement's join: %+v %v, want pending", a, err)
	}
	step()
	restart := t0.Add(50 * time.Second) // the claim's pend timeout (1m) has not passed
	for name, r := range restoreBoth(t, cfg, j, m, restart) {
		if p, inc, ok := r.Claimant(1); !ok || p != "w1b" || inc != "1" {
			t.Errorf("%s: rank 1's claimant after the restart: %q %q %v, want w1b", name, p, inc, ok)
		}
		if a, err := r.Heartbeat(w1b, 0, -1, restart.Add(time.Second)); err != nil || a.Action != Continue {
			t.Errorf("%s: the replacement's heartbeat after the restart: %+v %v, want continue", name, a, err)
		}
		// The pend timeout starts again at the restart, as a restored
		// node's heartbeat grace does: past the first master's deadline
		// the claim still waits.
		r.Tick(restart.Add(30 * time.Second))
		if a := r.Answer("w1b", "1", 1, 0); !a.Pending() {
			t.Errorf("%s: the replacement after the first master's pend deadline: %+v, want pending", name, a)
		}
		if _, err := r.Heartbeat(w1b, 0, -1, restart.Add(30*time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Leave(w1, false, kferrors.Failure{Code: "Preempted", Recoverable: true}, restart.Add(31*time.Second)); err != nil {
			t.Fatalf("%s: the old pod's leave: %v", name, err)
		}
		if n, _ := r.Node(1); n.Pod != "w1b" || n.State != Joining {
			t.Errorf("%s: rank 1 after the old pod left: %s %s, want w1b joining", name, n.Pod, n.State)
		}
		if _, _, ok := r.Claimant(1); ok {
			t.Errorf("%s: the claim outlived the hand-over", name)
		}
	}
}

// restoreBoth restores j at at twice, as a restarted master would: from a
// snapshot (all its records) and from the logs (m's merged changes).
func restoreBoth(t *testing.T, cfg Config, j *Job, m *merger, at time.Time) map[string]*Job {
	t.Helper()
	fromSnap, err := RestoreJob(cfg, j.allRecords(), at)
	if err != nil {
		t.Fatal(err)
	}
	fromLog, err := RestoreJob(cfg, m.records(), at)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*Job{"snapshot": fromSnap, "log": fromLog}
}

// A master whose --state store accepts connections and never answers fails
// its start within --state-timeout, with an error that says so, having
// logged what it waits for and since when. It used to wait without end,
// and without a word.
func TestStartBoundedOnSilentState(t *testing.T) {
	silent := testenv.Silent(t)
	t.Setenv("AWS_ACCESS_KEY_ID", testenv.MinIOAccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", testenv.MinIOSecretKey)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	defer func(d time.Duration) { stateWaitLogEvery = d }(stateWaitLogEvery)
	stateWaitLogEvery = 300 * time.Millisecond
	logs := &testenv.SyncBuffer{}
	const bound = 1500 * time.Millisecond
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := NewServer(t.Context(), Options{Token: "tok", StateURL: silent.URL("flyte", "job/kfelastic-master"), StateTimeout: bound,
			Job: Config{JobID: "silent", MinNodes: 1, MaxNodes: 2}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
		done <- err
	}()
	select {
	case err := <-done:
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), "no answer within --state-timeout 1.5s") || took > bound+3*time.Second {
			t.Errorf("start on a silent store: %v after %v, want a timeout error within about %v", err, took, bound)
		}
	case <-time.After(bound + 15*time.Second):
		t.Fatalf("start on a silent store still waits after %v\n%s", bound+15*time.Second, logs)
	}
	if !strings.Contains(logs.String(), `msg="waiting for the state to answer"`) || !strings.Contains(logs.String(), "since=") {
		t.Errorf("no log of the wait:\n%s", logs)
	}
}
