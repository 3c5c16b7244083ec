package events_test

import (
	"context"
	"fmt"
	"time"

	"gocloud.dev/blob/memblob"

	"github.com/kfelastic/kfelastic/events"
)

// An agent appends its pod's events next to the error documents; the
// report reads them back in time order.
func Example() {
	ctx := context.Background()
	bucket := memblob.OpenBucket(nil) // errors.OpenPrefix(ctx, url, true) in a pod
	defer bucket.Close()
	w := events.NewWriter(bucket)
	at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	w.Append(ctx, events.Event{Time: at.Add(2 * time.Second), Pod: "job-worker-1", Kind: events.Restart, Attempt: 2, RestartCount: 1, Reason: "failure"})
	w.Append(ctx, events.Event{Time: at, Pod: "job-worker-1", Kind: events.GroupStarted, Attempt: 1})

	log, err := events.Read(ctx, bucket, nil)
	if err != nil {
		panic(err)
	}
	for _, ev := range log.Events {
		fmt.Println(ev.Time.Format(time.TimeOnly), ev.Pod, ev.Kind, ev.Attempt)
	}
	data, _ := events.Encode(log.Events[1])
	fmt.Println(string(data))
	// Output:
	// 10:00:00 job-worker-1 group-started 1
	// 10:00:02 job-worker-1 restart 2
	// {"v":1,"time":"2026-11-21T10:00:02Z","pod":"job-worker-1","kind":"restart","attempt":2,"restartCount":1,"reason":"failure"}
}
