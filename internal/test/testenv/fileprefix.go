package testenv

import (
	"context"
	"testing"

	"gocloud.dev/blob"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// FilePrefix opens dir as a file:// output prefix, as the writers and the
// reader meet it (kferrors.OpenPrefix, creating it); it closes when the test
// ends.
func FilePrefix(t testing.TB, dir string) *blob.Bucket {
	t.Helper()
	b, err := kferrors.OpenPrefix(context.Background(), "file://"+dir, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
