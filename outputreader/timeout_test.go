package outputreader_test

import (
	"context"
	goerrors "errors"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/ioutils"
	"github.com/flyteorg/flyte/flytestdlib/promutils"
	"github.com/flyteorg/flyte/flytestdlib/storage"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/outputreader"
	"github.com/kfelastic/kfelastic/outputreader/flyteio"
)

// An S3 endpoint that accepts connections and never answers fails a read
// within Options.CallTimeout, Summarize as well (and WithCallTimeout bounds
// HasDocuments), with
// an error that says so; it does not hang it.
func TestSilentStoreFailsWithinCallTimeout(t *testing.T) {
	silent := testenv.Silent(t)
	t.Setenv("AWS_ACCESS_KEY_ID", testenv.MinIOAccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", testenv.MinIOSecretKey)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	// The test bounds itself: a hang fails it, it does not stall the suite.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, silent.URL("flyte", "metadata/attempt-0"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const limit = 300 * time.Millisecond
	for name, call := range map[string]func() error{
		"Read": func() error {
			_, err := outputreader.Read(ctx, outputreader.NewBucketSource(b), &outputreader.Options{CallTimeout: limit})
			return err
		},
		"Summarize": func() error {
			_, err := outputreader.Summarize(ctx, outputreader.NewBucketSource(b), &outputreader.Options{CallTimeout: limit})
			return err
		},
		"WaitFor": func() error {
			_, err := outputreader.WaitFor(ctx, outputreader.NewBucketSource(b), &outputreader.Options{CallTimeout: limit}, 1, time.Now().Add(time.Hour))
			return err
		},
		"HasDocuments": func() error {
			_, err := outputreader.HasDocuments(ctx, outputreader.WithCallTimeout(outputreader.NewBucketSource(b), limit))
			return err
		},
	} {
		start := time.Now()
		err := call()
		if took := time.Since(start); !goerrors.Is(err, outputreader.ErrNoAnswer) || took > 5*time.Second {
			t.Errorf("%s: %v after %v, want ErrNoAnswer within about %v", name, err, took, limit)
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: the test's own deadline ran out", name)
		}
	}
}

// What propeller hands the plugin: flytestdlib's stow S3 store, whose calls
// take no context, on MinIO that goes quiet (accepts, never answers) after
// the store was set up. Every call of the OutputReader (errors and outputs
// alike) fails within Options.CallTimeout instead of taking propeller's
// worker with it.
func TestSilentDataStoreBoundedOutputReader(t *testing.T) {
	minio := testenv.MinIO(t)
	silent := testenv.Silent(t)
	silent.ForwardTo(minio.Endpoint)
	// flytestdlib looks its container up when the store is made, with no
	// context: that happens while MinIO still answers.
	ds, err := storage.NewDataStore(kubeenv.DataStoreConfig(&testenv.MinIOProcess{Endpoint: silent.Endpoint}, minio.Bucket), promutils.NewTestScope())
	if err != nil {
		t.Fatal(err)
	}
	silent.Silence()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // the test's own bound
	defer cancel()
	prefix := storage.DataReference("s3://" + minio.Bucket + "/metadata/n0/attempt-0")
	const limit = 300 * time.Millisecond
	r, err := flyteio.NewOutputReader(ctx, ds, ioutils.NewReadOnlyOutputFilePaths(ctx, ds, prefix), 0, &outputreader.Options{CallTimeout: limit})
	if err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"IsError":    func() error { _, err := r.IsError(ctx); return err },
		"ReadError":  func() error { _, err := r.ReadError(ctx); return err },
		"Exists":     func() error { _, err := r.Exists(ctx); return err },
		"DeckExists": func() error { _, err := r.DeckExists(ctx); return err },
		"Read":       func() error { _, _, err := r.Read(ctx); return err },
		"outputreader.Read": func() error {
			_, err := outputreader.Read(ctx, flyteio.NewDataStoreSource(ds, prefix), &outputreader.Options{CallTimeout: limit})
			return err
		},
		"outputreader.Summarize": func() error {
			_, err := outputreader.Summarize(ctx, flyteio.NewDataStoreSource(ds, prefix), &outputreader.Options{CallTimeout: limit})
			return err
		},
	} {
		start := time.Now()
		err := call()
		if took := time.Since(start); !goerrors.Is(err, outputreader.ErrNoAnswer) || took > 5*time.Second {
			t.Errorf("%s: %v after %v, want ErrNoAnswer within about %v", name, err, took, limit)
		}
	}
}
