package outputreader_test

import (
	"context"
	"fmt"
	"time"

	"gocloud.dev/blob/memblob"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Three workers of a job failed; each wrote its document. The peers'
// connection errors were written first, but rank 1's exception came first.
func ExampleRead() {
	ctx := context.Background()
	bucket := memblob.OpenBucket(nil) // in real use: kferrors.OpenPrefix(ctx, "s3://…/attempt-0", false)
	defer bucket.Close()
	w := kferrors.NewWriter(bucket, nil)
	at := time.Date(2026, 11, 21, 10, 0, 1, 250000000, time.UTC)
	w.Write(ctx, kferrors.UserError("torch.distributed.DistNetworkError", "Connection closed by peer", "job-worker-0", at.Add(400*time.Millisecond)))
	w.Write(ctx, kferrors.UserError("torch.distributed.DistNetworkError", "Connection closed by peer", "job-worker-2", at.Add(410*time.Millisecond)))
	w.Write(ctx, kferrors.UserError("ValueError", "loss is NaN at step 812", "job-worker-1", at))

	report, err := outputreader.Read(ctx, outputreader.NewBucketSource(bucket), nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(report.Message())
	fmt.Println("recoverable:", report.IsRecoverable())
	// Output:
	// [job-worker-1, 2026-11-21T10:00:01.250000000Z] ValueError: loss is NaN at step 812
	// Also failed: 2 other workers (2× torch.distributed.DistNetworkError). Earliest failure shown.
	// recoverable: false
}
