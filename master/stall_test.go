package master_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/master"
)

// A storage stall longer than the heartbeat timeout (the state's write
// hangs: a full disk, an S3 outage) loses no node: heartbeat timeouts count
// only time in which the master could answer. Issue 28: a 15 s stall with a
// 6 s timeout had every live node declared lost once the write went
// through (NodeLost, relaunched, every agent told to exit). Whether the
// master's first batch after the stall held its timer's tick before the
// heartbeats queued meanwhile was the loop's coin to toss, so the stall
// comes five times.
func TestStorageStallLosesNoNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const stall = 15 * time.Second
		var stalling atomic.Bool
		hook := func(ctx context.Context) error {
			if stalling.CompareAndSwap(true, false) {
				select {
				case <-time.After(stall):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
		m := startInBubble(t, master.WithStateWriteHook(master.Options{StateURL: "mem://", HeartbeatInterval: time.Second,
			Job: master.Config{JobID: "stall", MinNodes: 2, MaxNodes: 2, HeartbeatTimeout: 6 * time.Second}}, hook))
		c := m.client(t, token)
		joinAll(t, c, 2)
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for i := range 2 {
			// An agent's heartbeat (agent/masterclient.go): a long poll sent
			// again at once when answered, half a second after a failure,
			// each bounded by the interval and 10 s.
			wg.Go(func() {
				for ctx.Err() == nil {
					cctx, ccancel := context.WithTimeout(ctx, 11*time.Second)
					res, err := c.Heartbeat(cctx, &masterpb.HeartbeatRequest{Node: node(i), Round: 1, WaitMs: 1000, Step: -1})
					ccancel()
					if err == nil && res.GetAction() != masterpb.HeartbeatResponse_NONE {
						t.Errorf("node %d told %v (%v) after a storage stall", i, res.GetAction(), res.GetExit())
						return
					}
					if err != nil {
						time.Sleep(500 * time.Millisecond)
					}
				}
			})
		}
		time.Sleep(5 * time.Second)
		for seq := range uint64(5) {
			stalling.Store(true)
			start := time.Now()
			if _, err := c.Store(ctx, &masterpb.StoreRequest{Client: "torch", Seq: seq + 1,
				Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: "k", Value: []byte("v")}}}); err != nil {
				t.Fatalf("set: %v", err)
			}
			if d := time.Since(start); d < stall {
				t.Fatalf("the set was answered after %v, within the %v stall", d, stall)
			}
			time.Sleep(3 * time.Second)
			st, err := c.Status(ctx, &masterpb.StatusRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(st.GetDecisions()) != 0 {
				t.Fatalf("after stall %d of %v (heartbeat timeout 6s): decisions %v", seq+1, stall, st.GetDecisions())
			}
			for _, n := range st.GetNodes() {
				if n.GetState() != string(master.Running) {
					t.Fatalf("after stall %d: node %d is %s", seq+1, n.GetRank(), n.GetState())
				}
			}
		}
		cancel()
		wg.Wait()
	})
}
