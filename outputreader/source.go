package outputreader

import (
	"context"
	goerrors "errors"
	"fmt"
	"io"
	"sync"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// ErrNotFound is what a Source returns when a listed document vanished before
// it could be read. Read skips such a document instead of failing.
var ErrNotFound = goerrors.New("error document not found")

// ErrUnreadable marks one entry under the prefix that is not a document
// anyone can read: a symbolic link (never followed, see NewBucketSource), a
// FIFO or other special file, a file this process may not read, an object
// the store refuses access to. Read skips such an entry and reports it; it
// never fails the whole read for one.
var ErrUnreadable = goerrors.New("unreadable error document")

// Object is one listed object: what a listing tells without reading it.
type Object struct {
	// Key is the object's name relative to the output prefix.
	Key string
	// Size in bytes, -1 when the listing does not say (flytestdlib's DataStore).
	Size int64
	// Modified is the object's modification time, zero when the backend
	// cannot tell (flytestdlib's DataStore exposes none).
	Modified time.Time
	// Unusable, when set, is why the listing alone shows the entry cannot be
	// read as a document (it wraps ErrUnreadable); Read skips it unread.
	Unusable error
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
//
// On a file:// prefix a document is a regular file directly under it. A
// symbolic link is listed as unusable and never followed: it may lead out
// of the prefix (the reader may run with more rights than the writer had),
// into a loop, or to a document listed already. A FIFO or device is
// unusable too, so that no read blocks on one. A file that cannot be
// opened (no permission, vanished) is skipped and reported; so is an object
// a store denies access to. Errors of the store itself (no answer, a
// server error) still fail the read: skipping a document because of them
// could name the wrong root cause.
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
		page, next, err := s.listPage(ctx, token, opts)
		if err != nil {
			return fmt.Errorf("list error documents: %w", err)
		}
		for _, obj := range page {
			if obj.IsDir || !kferrors.IsDocumentKey(obj.Key) {
				continue
			}
			o := Object{Key: obj.Key, Size: obj.Size, Modified: obj.ModTime}
			if why := kferrors.Irregular(obj); why != "" {
				o.Unusable = fmt.Errorf("%w: %s", ErrUnreadable, why)
			}
			if err := yield(o); err != nil {
				return err
			}
		}
		if len(next) == 0 {
			return nil
		}
		token = next
	}
}

// listPage is one page of the listing (kferrors.ListPage: again when an
// entry vanished meanwhile).
func (s *bucketSource) listPage(ctx context.Context, token []byte, opts *blob.ListOptions) ([]*blob.ListObject, []byte, error) {
	return kferrors.ListPage(ctx, s.b, token, listPageSize, opts)
}

func (s *bucketSource) Read(ctx context.Context, key string, max int) ([]byte, error) {
	r, err := s.b.NewReader(ctx, key, nil)
	if err != nil {
		return nil, readError(key, err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
	if err != nil {
		return nil, readError(key, err)
	}
	return data, nil
}

// readError classifies the error of reading one document: vanished
// (ErrNotFound); refused for this entry alone (ErrUnreadable): access
// denied by the store, or any error of the local file system about this
// file (a permission, a loop, a directory in its place); else the store's
// own error, which fails the read.
func readError(key string, err error) error {
	switch {
	case gcerrors.Code(err) == gcerrors.NotFound:
		return fmt.Errorf("%s: %w", key, ErrNotFound)
	case kferrors.EntryError(err):
		return fmt.Errorf("%s: %w: %v", key, ErrUnreadable, err)
	}
	return err
}

// ErrNoAnswer is what a Source bounded by WithCallTimeout returns when the
// store did not answer a call in time.
var ErrNoAnswer = goerrors.New("storage gave no answer in time")

// WithCallTimeout bounds every List and Read of src by d (d ≤ 0: src as it
// is). A call that runs out fails with an error wrapping ErrNoAnswer and the
// store's own. The bound holds even for a Source that ignores its context
// (flytestdlib's stow stores do): see CallWithin.
func WithCallTimeout(src Source, d time.Duration) Source {
	if d <= 0 {
		return src
	}
	if t, ok := src.(timeoutSource); ok && t.d <= d {
		return src
	}
	return timeoutSource{Source: src, d: d}
}

type timeoutSource struct {
	Source
	d time.Duration
}

func (s timeoutSource) List(ctx context.Context, yield func(Object) error) error {
	// An abandoned listing may still be yielding: after the abandon its
	// objects go nowhere, so the caller's yield is never called late.
	var mu sync.Mutex
	abandoned := false
	guarded := func(o Object) error {
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			return ErrNoAnswer
		}
		return yield(o)
	}
	_, err := CallWithin(ctx, s.d, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, s.Source.List(ctx, guarded)
	})
	if goerrors.Is(err, ErrNoAnswer) {
		mu.Lock()
		abandoned = true
		mu.Unlock()
	}
	return err
}

func (s timeoutSource) Read(ctx context.Context, key string, max int) ([]byte, error) {
	return CallWithin(ctx, s.d, func(ctx context.Context) ([]byte, error) { return s.Source.Read(ctx, key, max) })
}

var errCallTimedOut = goerrors.New("call timed out")

// CallWithin runs call with a context that ends after d and returns its
// result, or, once d has passed, an error wrapping ErrNoAnswer without
// waiting for call any longer. A call that ignores its context (the AWS SDK
// v1 under flytestdlib's stow stores takes none) is abandoned: it goes on in
// the background until the store answers or the connection dies, and its
// result is dropped. Leaking that goroutine is the price of never hanging
// the caller (a propeller worker, the CLI) on a store that does not answer.
func CallWithin[T any](ctx context.Context, d time.Duration, call func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, d, errCallTimedOut)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := call(ctx)
		done <- result{v, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		r.err = ctx.Err()
	}
	if r.err != nil && context.Cause(ctx) == errCallTimedOut {
		var zero T
		return zero, fmt.Errorf("%w within %v: %w", ErrNoAnswer, d, r.err)
	}
	return r.v, r.err
}
