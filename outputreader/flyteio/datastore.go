package flyteio

import (
	"context"
	goerrors "errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/flyteorg/flyte/flytestdlib/storage"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
)

// NewDataStoreSource reads documents under outputPrefix (the directory that
// holds error.pb, e.g. s3://bucket/metadata/…/0) through flytestdlib's
// DataStore. The DataStore tells neither sizes nor modification times in a
// listing, so oversized documents are detected while reading (at most
// MaxDocumentBytes+1 bytes are read) and a document without a timestamp is
// ranked by the time Read listed it (Document.AtSource == TimeFromListing).
func NewDataStoreSource(store *storage.DataStore, outputPrefix storage.DataReference) outputreader.Source {
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

func (s *dataStoreSource) List(ctx context.Context, yield func(outputreader.Object) error) error {
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

func (s *dataStoreSource) list(ctx context.Context, ref storage.DataReference, yield func(outputreader.Object) error) error {
	// As for buckets (listPageSize): stow's "local" kind walks the whole
	// container for every page; S3 caps a page at 1000 keys anyway.
	pageSize := outputreader.ListPageSize()
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
			if err := yield(outputreader.Object{Key: name, Size: -1}); err != nil {
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
		return nil, fmt.Errorf("%s: %w", key, outputreader.ErrNotFound)
	case storage.IsExceedsLimit(err):
		return nil, fmt.Errorf("%w: %v", kferrors.ErrTooLarge, err)
	default:
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(io.LimitReader(rc, int64(max)+1))
}
