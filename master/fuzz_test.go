package master

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/memblob"
	"google.golang.org/protobuf/proto"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
)

// FuzzJob drives the state machine with any sequence of requests — hostile
// ones included: other pods' ranks, stale incarnations, replayed rounds,
// reports for checks that do not exist — and checks what must always hold:
// no panic; the counters agree with a recount; no pod holds two live ranks;
// the latest round's members are distinct, in rank order, with their world
// size; the records, a snapshot's or the batches', restore to the same
// nodes and claims.
func FuzzJob(f *testing.F) {
	f.Add([]byte{0x12, 0x00, 0x01, 0x10, 0x11, 0x50, 0x21, 0x60, 0x00})
	f.Add([]byte{0x23, 0x00, 0x01, 0x02, 0x03, 0x33, 0x41, 0x61, 0x10, 0x11, 0x14})
	f.Add([]byte{0xff, 0x00, 0x01, 0x02, 0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x60, 0x60})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		cfg := Config{JobID: "fuzz", MinNodes: 1 + int(data[0]&3), NetworkCheck: data[0]&0x80 != 0,
			ExcludeStraggler: data[0]&0x40 != 0, WaitingTimeout: 2 * time.Second, HeartbeatTimeout: 10 * time.Second,
			JoinTimeout: 30 * time.Second, PendTimeout: 40 * time.Second, CheckTimeout: 5 * time.Second}
		cfg.MaxNodes = cfg.MinNodes + int(data[0]>>2&3)
		j, err := NewJob(cfg)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1e9, 0)
		batches := newMerger()
		codes := []string{"Preempted", "OOMKilled", "ValueError", "NodeLost", "Hang", "Evicted"}
		for i := 1; i+1 < len(data); i += 2 {
			op, arg := data[i], data[i+1]
			pod := fmt.Sprintf("p%d", op&7)
			n := NodeInfo{Pod: pod, Incarnation: fmt.Sprint(arg & 1), Rank: int(arg>>1&7) - 1, LocalWorldSize: 1 + int(arg>>4&1),
				Addr: "a" + pod, Port: 1000 + int(op&7), Host: "h" + pod}
			switch op >> 4 & 7 {
			case 0, 1:
				_, _ = j.Join(n, int64(arg>>5), now)
			case 2:
				_, _ = j.Heartbeat(n, int64(arg>>5), -1, now)
			case 3:
				_, _ = j.Leave(n, arg&0x20 != 0, kferrors.Failure{Code: codes[int(arg>>5)%len(codes)], Recoverable: arg&0x40 == 0}, now)
			case 4:
				_, _ = j.PodGone(pod, kferrors.Failure{Code: codes[int(arg)%len(codes)], Recoverable: true}, now)
			case 5:
				if c := j.check; c != nil {
					_ = j.ReportCheck(n, c.seq, c.round, CheckReport{OK: arg&0x20 == 0, Self: arg&0x40 != 0,
						Elapsed: time.Duration(arg) * 10 * time.Millisecond, Message: "m"}, now)
				}
			case 6:
				now = now.Add(time.Duration(arg) * 100 * time.Millisecond)
				j.Tick(now)
			case 7:
				_ = j.ReportCheck(n, int64(arg&3), int(arg>>2&3), CheckReport{OK: true, Elapsed: time.Second}, now)
			}
			batches.add(j.dirtyRecords(j.Ready().Dirty))
			checkInvariants(t, j)
		}
		for name, records := range map[string][]*masterpb.StateRecord{"snapshot": j.allRecords(), "batches": batches.records()} {
			restored, err := RestoreJob(cfg, records, now)
			if err != nil {
				t.Fatalf("restore from the %s: %v", name, err)
			}
			sameRestored(t, j, restored)
			checkInvariants(t, restored)
		}
	})
}

func checkInvariants(t *testing.T, j *Job) {
	t.Helper()
	counts := [5]int{j.nWaiting, j.nRunning, j.nRelaunching, j.latestAlive, j.latestDown}
	j.recount()
	if got := [5]int{j.nWaiting, j.nRunning, j.nRelaunching, j.latestAlive, j.latestDown}; got != counts {
		t.Fatalf("counters %v, a recount gives %v", counts, got)
	}
	live := map[string]int{}
	for rank, n := range j.nodes {
		if n.Rank != rank {
			t.Fatalf("node under rank %d says rank %d", rank, n.Rank)
		}
		if n.State.alive() && n.Exclusion == nil {
			if other, ok := live[n.Pod]; ok {
				t.Fatalf("pod %s holds live ranks %d and %d", n.Pod, other, rank)
			}
			live[n.Pod] = rank
		}
	}
	if r := j.latest; r != nil {
		if !slices.IsSorted(r.Ranks) || len(slices.Compact(slices.Clone(r.Ranks))) != len(r.Ranks) {
			t.Fatalf("round %d ranks %v", r.Number, r.Ranks)
		}
		if len(r.Ranks) < j.cfg.MinNodes || len(r.Ranks) > j.cfg.MaxNodes {
			t.Fatalf("round %d has %d members, outside [%d, %d]", r.Number, len(r.Ranks), j.cfg.MinNodes, j.cfg.MaxNodes)
		}
		sum := 0
		for _, s := range r.LocalWorldSizes {
			sum += s
		}
		if sum != r.world {
			t.Fatalf("round %d world %d, sizes sum to %d", r.Number, r.world, sum)
		}
	}
}

// FuzzStateDecode loads any bytes as a state log object: a clear error or
// a job, never a panic.
func FuzzStateDecode(f *testing.F) {
	good := &masterpb.StateFile{Format: 1, Job: "fuzz", Seq: 1, Records: []*masterpb.StateRecord{
		{Record: &masterpb.StateRecord_Node{Node: &masterpb.NodeRecord{Rank: 0, Pod: "p", State: "running", Round: 1}}},
		{Record: &masterpb.StateRecord_Round{Round: &masterpb.RoundRecord{Number: 1, Ranks: []int32{0}, LocalWorldSizes: []int32{2}}}},
		{Record: &masterpb.StateRecord_Kv{Kv: &masterpb.KVRecord{Key: "/k", Value: []byte("v")}}},
		{Record: &masterpb.StateRecord_Claim{Claim: &masterpb.ClaimRecord{Rank: 0, Pod: "q", Incarnation: "1", LocalWorldSize: 2, AfterRound: 1}}},
		{Record: &masterpb.StateRecord_Claim{Claim: &masterpb.ClaimRecord{Rank: 1, Ended: true}}},
	}}
	goodBytes, _ := proto.Marshal(good)
	f.Add(goodBytes)
	f.Add([]byte{})
	f.Add([]byte{0x08, 0x01, 0x12, 0x04, 'f', 'u', 'z', 'z'})
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx := context.Background()
		b, err := blob.OpenBucket(ctx, "mem://")
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := b.WriteAll(ctx, seqKey(logDir, 1), data, nil); err != nil {
			t.Fatal(err)
		}
		_, records, err := loadState(ctx, stateSpec{bucket: b, job: "fuzz"})
		if err != nil {
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("load: %v, want ErrBadState", err)
			}
			return
		}
		j, err := RestoreJob(Config{JobID: "fuzz", MinNodes: 1, MaxNodes: 4}, records, time.Unix(1e9, 0))
		if err != nil {
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("restore: %v, want ErrBadState", err)
			}
			return
		}
		j.Tick(time.Unix(1e9, 0).Add(time.Minute))
		checkInvariants(t, j)
	})
}
