package outputreader

import (
	"context"
	goerrors "errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/flyteorg/flyte/flytestdlib/storage"
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

func (s *bucketSource) List(ctx context.Context, yield func(Object) error) error {
	// The delimiter keeps the listing to the prefix itself: documents are never
	// nested, and a prefix may hold large trees of other outputs.
	it := s.b.List(&blob.ListOptions{Prefix: kferrors.KeyPrefix, Delimiter: "/"})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list error documents: %w", err)
		}
		if obj.IsDir || !kferrors.IsDocumentKey(obj.Key) {
			continue
		}
		if err := yield(Object{Key: obj.Key, Size: obj.Size, Modified: obj.ModTime}); err != nil {
			return err
		}
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

// NewDataStoreSource reads documents under outputPrefix (the directory that
// holds error.pb, e.g. s3://bucket/metadata/…/0) through flytestdlib's
// DataStore. The DataStore tells neither sizes nor modification times in a
// listing, so oversized documents are detected while reading (at most
// MaxDocumentBytes+1 bytes are read) and a document without a timestamp is
// ranked by the time Read listed it (Document.AtSource == TimeFromListing).
func NewDataStoreSource(store *storage.DataStore, outputPrefix storage.DataReference) Source {
	p := strings.TrimRight(string(outputPrefix), "/")
	_, container, key, _ := storage.DataReference(p).Split()
	return &dataStoreSource{store: store, prefix: p, container: container, prefixKey: key}
}

type dataStoreSource struct {
	store     *storage.DataStore
	prefix    string
	container string
	prefixKey string
}

func (s *dataStoreSource) String() string { return s.prefix }

func (s *dataStoreSource) List(ctx context.Context, yield func(Object) error) error {
	// Narrow first, as upstream does: "<prefix>/error" lets S3 filter server
	// side. flytestdlib's in-memory store only lists whole directories
	// ("<ref>/…") and reports an empty one as os.ErrNotExist, so on
	// ErrNotExist the directory itself is listed.
	err := s.list(ctx, storage.DataReference(s.prefix+"/"+kferrors.KeyPrefix), yield)
	if goerrors.Is(err, os.ErrNotExist) {
		err = s.list(ctx, storage.DataReference(s.prefix), yield)
		if goerrors.Is(err, os.ErrNotExist) {
			return nil
		}
	}
	return err
}

func (s *dataStoreSource) list(ctx context.Context, ref storage.DataReference, yield func(Object) error) error {
	const pageSize = 1000
	cursor := storage.NewCursorAtStart()
	for !storage.IsCursorEnd(cursor) {
		var refs []storage.DataReference
		var err error
		refs, cursor, err = s.store.List(ctx, ref, pageSize, cursor)
		if err != nil {
			if goerrors.Is(err, os.ErrNotExist) {
				return err
			}
			return fmt.Errorf("list error documents under %s: %w", s.prefix, err)
		}
		for _, r := range refs {
			name, ok := s.relative(r)
			if !ok || !kferrors.IsDocumentKey(name) {
				continue
			}
			if err := yield(Object{Key: name, Size: -1}); err != nil {
				return err
			}
		}
	}
	return nil
}

// relative returns the name of a listed reference relative to the prefix, and
// false for anything not directly under it. stow's "local" kind names items by
// absolute file URL (file:///abs/path/<container>/<key>), so a reference is
// also accepted when its directory ends with "<container>/<prefix key>".
func (s *dataStoreSource) relative(ref storage.DataReference) (string, bool) {
	if rest, ok := strings.CutPrefix(string(ref), s.prefix+"/"); ok {
		return rest, !strings.Contains(rest, "/")
	}
	_, _, key, err := ref.Split()
	if err != nil {
		return "", false
	}
	dir, name := path.Split(key)
	want := "/" + path.Join(s.container, s.prefixKey)
	return name, strings.HasSuffix("/"+strings.TrimSuffix(dir, "/"), want)
}

func (s *dataStoreSource) Read(ctx context.Context, key string, max int) ([]byte, error) {
	rc, err := s.store.ReadRaw(ctx, storage.DataReference(s.prefix+"/"+key))
	switch {
	case err == nil:
	case storage.IsNotFound(err) || goerrors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%s: %w", key, ErrNotFound)
	case storage.IsExceedsLimit(err):
		return nil, fmt.Errorf("%w: %v", kferrors.ErrTooLarge, err)
	default:
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(io.LimitReader(rc, int64(max)+1))
}
