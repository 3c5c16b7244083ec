package outputreader_test

import (
	"context"
	goerrors "errors"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/testenv"
	"github.com/kfelastic/kfelastic/outputreader"
)

// An S3 endpoint that accepts connections and never answers fails a read
// within Options.CallTimeout (and WithCallTimeout bounds HasDocuments), with
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
