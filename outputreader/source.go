package outputreader

import (
	"context"
	goerrors "errors"
	"fmt"
	"io"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// ErrNotFound is what a Source returns when a listed document vanished before
// it could be read. Read skips such a document instead of failing.
var ErrNotFound = goerrors.New("error document not found")

// Object is one listed object: what a listing tells without reading it.
type Object struct {
	// Key is the object's name relative to the output prefix.
	Key string
	// Size in bytes, -1 when the listing does not say (flytestdlib's DataStore).
	Size int64
	// Modified is the object's modification time, zero when the backend
	// cannot tell (flytestdlib's DataStore exposes none).
	Modified time.Time
}

// Source lists and reads the error documents under one output prefix. The
// two implementations are NewBucketSource (gocloud.dev) and
// NewDataStoreSource (flytestdlib, what propeller hands a plugin).
type Source interface {
	// List calls yield for every object directly under the prefix whose name
	// looks like an error document (kferrors.IsDocumentKey), in any order.
	// An absent prefix lists nothing; it is not an error.
	List(ctx context.Context, yield func(Object) error) error
	// Read returns the bytes of the document key, at most max+1 bytes, so that
	// the caller can tell a document larger than max. A document that no
	// longer exists gives an error wrapping ErrNotFound.
	Read(ctx context.Context, key string, max int) ([]byte, error)
	// String names the prefix in messages.
	String() string
}

// NewBucketSource reads documents from b, whose keys are relative to the
// output prefix (see kferrors.OpenPrefix). It does not own b.
func NewBucketSource(b *blob.Bucket) Source { return &bucketSource{b: b} }

type bucketSource struct{ b *blob.Bucket }

func (s *bucketSource) String() string { return "bucket" }

// listPageSize is large because fileblob walks its directory from the start
// for every page (stat and attribute lookup per file before the page token):
// 1000-key pages make a listing quadratic. S3 servers cap a page at 1000 keys
// whatever is asked.
// It is a variable only so that tests can exercise paging.
var listPageSize = 10000

// ListPageSize is how many keys a source asks for per listing page (the
// Flyte DataStore source in flyteio uses it too).
func ListPageSize() int { return listPageSize }

func (s *bucketSource) List(ctx context.Context, yield func(Object) error) error {
	// The delimiter keeps the listing to the prefix itself: documents are never
	// nested, and a prefix may hold large trees of other outputs.
	opts := &blob.ListOptions{Prefix: kferrors.KeyPrefix, Delimiter: "/"}
	token := blob.FirstPageToken
	for {
		page, next, err := s.b.ListPage(ctx, token, listPageSize, opts)
		if err != nil {
			return fmt.Errorf("list error documents: %w", err)
		}
		for _, obj := range page {
			if obj.IsDir || !kferrors.IsDocumentKey(obj.Key) {
				continue
			}
			if err := yield(Object{Key: obj.Key, Size: obj.Size, Modified: obj.ModTime}); err != nil {
				return err
			}
		}
		if len(next) == 0 {
			return nil
		}
		token = next
	}
}

func (s *bucketSource) Read(ctx context.Context, key string, max int) ([]byte, error) {
	r, err := s.b.NewReader(ctx, key, nil)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return nil, fmt.Errorf("%s: %w", key, ErrNotFound)
		}
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, int64(max)+1))
}
