package master_test

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/master"
)

// BenchmarkDurableStoreSet measures acknowledged (durable) store sets
// through a real master on loopback with a file:// state in
// KFELASTIC_BENCH_DIR (default: the test's temporary folder), from 1 and 16
// concurrent clients: p50/p99 latency per set and sets per second. Group
// commit is what keeps the 16-client throughput when each batch is fsynced.
//
//	go test ./master -run '^$' -bench DurableStoreSet -benchtime 2000x
func BenchmarkDurableStoreSet(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			dir := os.Getenv("KFELASTIC_BENCH_DIR")
			if dir == "" {
				dir = b.TempDir()
			} else {
				var err error
				if dir, err = os.MkdirTemp(dir, "bench-state-"); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { os.RemoveAll(dir) })
			}
			addr, _ := startServer(b, master.Config{JobID: "bench", MinNodes: 1, MaxNodes: 1}, "file://"+dir)
			c := dial(b, addr, token)
			ctx := b.Context()
			// Warm the connection.
			if _, err := c.Store(ctx, &masterpb.StoreRequest{Op: &masterpb.StoreRequest_NumKeys{NumKeys: &masterpb.StoreNumKeys{}}}); err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			lat := make([][]time.Duration, clients)
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for i := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					client := fmt.Sprintf("c%d", i)
					for seq := uint64(1); next.Add(1) <= int64(b.N); seq++ {
						t0 := time.Now()
						_, err := c.Store(ctx, &masterpb.StoreRequest{Client: client, Seq: seq,
							Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: client, Value: []byte("value")}}})
						if err != nil {
							b.Error(err)
							return
						}
						lat[i] = append(lat[i], time.Since(t0))
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			all := slices.Concat(lat...)
			slices.Sort(all)
			if len(all) == 0 {
				return
			}
			b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(len(all))/elapsed.Seconds(), "sets/s")
		})
	}
}
