package outputreader_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/ioutils"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/k8s"
	"github.com/flyteorg/flyte/flytestdlib/promutils"
	"github.com/flyteorg/flyte/flytestdlib/storage"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/outputreader"
	"github.com/kfelastic/kfelastic/outputreader/flyteio"
)

// minioDataStore is flytestdlib's DataStore on a fresh MinIO bucket: the
// storage propeller hands a plugin, and the one upstream's reader runs on.
// (Upstream's earliest reader cannot list flytestdlib's in-memory store: it
// lists "<dir>/error", which that store treats as a directory.)
func minioDataStore(t *testing.T) (*storage.DataStore, storage.DataReference) {
	s := testenv.MinIO(t)
	ds, err := storage.NewDataStore(kubeenv.DataStoreConfig(s.MinIOProcess, s.Bucket), promutils.NewTestScope())
	if err != nil {
		t.Fatal(err)
	}
	return ds, storage.DataReference(fmt.Sprintf("s3://%s/metadata/propeller/n0/attempt-0", s.Bucket))
}

func putRaw(t *testing.T, ds *storage.DataStore, prefix storage.DataReference, key string, data []byte) {
	t.Helper()
	if err := ds.WriteRaw(context.Background(), prefix+"/"+storage.DataReference(key), int64(len(data)), storage.Options{}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
}

// TestAgreesWithUpstreamEarliestReader writes documents as flytekit writes
// them (error-<uuid hex>.pb, timestamp and worker set) mixed with ours, where
// upstream's earliestFileErrorReader is well-defined (every document has a
// distinct timestamp, none is corrupt), and checks both pick the same one —
// through Read and through OutputReader.ReadError on the same DataStore.
func TestAgreesWithUpstreamEarliestReader(t *testing.T) {
	ctx := context.Background()
	ds, prefix := minioDataStore(t)
	paths := ioutils.NewReadOnlyOutputFilePaths(ctx, ds, prefix)
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	upstream, err := ioutils.NewRemoteFileOutputReaderWithErrorAggregationStrategy(ctx, ds, paths, 0, k8s.EarliestErrorAggregationStrategy)
	if err != nil {
		t.Fatal(err)
	}
	ours, err := flyteio.NewOutputReader(ctx, ds, paths, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	used := map[int64]bool{}
	for round := range 3 {
		for i := range 30 {
			var ns int64
			for ns = rng.Int64N(int64(10 * time.Second)); used[ns]; ns = rng.Int64N(int64(10 * time.Second)) {
			}
			used[ns] = true
			at := base.Add(time.Duration(ns))
			worker := fmt.Sprintf("job-worker-%d", round*30+i)
			var f kferrors.Failure
			if i%3 == 0 {
				f = kferrors.SystemFailure(kferrors.CodePreempted, "terminated from outside", worker, at)
			} else {
				f = kferrors.UserError(fmt.Sprintf("Error%d", i), fmt.Sprintf("message %d", i), worker, at)
			}
			key := kferrors.NewKey(at, worker, kferrors.RandomSuffix())
			if i%2 == 0 {
				key = fmt.Sprintf("error-%016x%016x.pb", rng.Uint64(), rng.Uint64())
			}
			putRaw(t, ds, prefix, key, encode(t, f))
		}
		want, err := upstream.ReadError(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r, err := outputreader.Read(ctx, flyteio.NewDataStoreSource(ds, prefix), nil)
		if err != nil {
			t.Fatal(err)
		}
		got := flyteio.ExecutionError(r.Summary())
		if got.Code != want.Code || got.Worker != want.Worker || !got.Timestamp.AsTime().Equal(want.Timestamp.AsTime()) ||
			got.Kind != want.Kind || got.IsRecoverable != want.IsRecoverable || r.RootCause.Failure.Message != want.Message {
			t.Fatalf("round %d: ours %+v, upstream %+v", round, got, want)
		}
		viaReader, err := ours.ReadError(ctx)
		if err != nil || viaReader.Worker != want.Worker || viaReader.Message != r.Message() {
			t.Fatalf("OutputReader.ReadError: %+v %v", viaReader, err)
		}
		if isErr, err := ours.IsError(ctx); !isErr || err != nil {
			t.Fatalf("IsError = %v, %v", isErr, err)
		}
	}

	// Where upstream is not well-defined they part: the legacy error.pb has
	// no timestamp, upstream ranks it as 1970 and picks it; ours ranks it by
	// its read time (the DataStore tells no modification time), after every
	// dated document.
	putRaw(t, ds, prefix, kferrors.LegacyKey, encode(t, kferrors.UserError("OldError", "legacy", "", time.Time{})))
	up, err := upstream.ReadError(ctx)
	if err != nil || up.Code != "OldError" {
		t.Fatalf("upstream: %+v %v", up, err)
	}
	r, err := outputreader.Read(ctx, flyteio.NewDataStoreSource(ds, prefix), nil)
	if err != nil || r.RootCause.Failure.Code == "OldError" {
		t.Fatalf("ours picked the untimed legacy document: %+v %v", r.RootCause, err)
	}
}

// TestOutputReaderWithoutDocuments: no documents gives upstream's
// "ErrorFileNotFound", recoverable; a corrupt one, where upstream says
// "ErrorFileBadFormat", is the failure of its pod, recoverable as
// upstream's (kferrors.CodeUnreadableDocument).
func TestOutputReaderWithoutDocuments(t *testing.T) {
	ctx := context.Background()
	ds, err := storage.NewDataStore(&storage.Config{Type: storage.TypeMemory}, promutils.NewTestScope())
	if err != nil {
		t.Fatal(err)
	}
	prefix := storage.DataReference("s3://flyte/metadata/n0/attempt-0")
	reader, err := flyteio.NewOutputReader(ctx, ds, ioutils.NewReadOnlyOutputFilePaths(ctx, ds, prefix), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	ee, err := reader.ReadError(ctx)
	if err != nil || ee.Code != flyteio.CodeNoDocuments || !ee.IsRecoverable {
		t.Fatalf("%+v %v", ee, err)
	}
	if isErr, err := reader.IsError(ctx); isErr || err != nil {
		t.Fatalf("IsError = %v %v", isErr, err)
	}
	putRaw(t, ds, prefix, "error-abc.pb", []byte("junk"))
	ee, err = reader.ReadError(ctx)
	if err != nil || ee.Code != kferrors.CodeUnreadableDocument || !ee.IsRecoverable || ee.Kind != core.ExecutionError_SYSTEM {
		t.Fatalf("%+v %v", ee, err)
	}
}
