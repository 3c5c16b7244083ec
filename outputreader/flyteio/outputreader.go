package flyteio

import (
	"context"
	"fmt"
	"path"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"

	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/io"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/ioutils"
	"github.com/flyteorg/flyte/flytestdlib/storage"

	"github.com/kfelastic/kfelastic/outputreader"
)

// OutputReader implements flyteplugins' io.OutputReader. Errors come from
// Read over the DataStore, in the directory of outPaths.GetErrorPath() (where
// flytekit writes error.pb and its error-<uuid>.pb files); outputs, decks and
// their size limits are upstream's ioutils.RemoteFileOutputReader, embedded.
//
// Every call is bounded by opts.CallTimeout (when > 0), the outputs' reads as
// much as the error documents': propeller calls them from its workers, and a
// store that never answers must not take a worker with it.
type OutputReader struct {
	ioutils.RemoteFileOutputReader
	src    outputreader.Source
	opts   *outputreader.Options
	prefix storage.DataReference
	// timeout bounds each method's call; 0: none.
	timeout time.Duration
}

var _ io.OutputReader = (*OutputReader)(nil)

// NewOutputReader reads the outputs and error documents of one task attempt.
// maxDatasetSize bounds outputs as upstream does (0: flytestdlib's limit).
func NewOutputReader(ctx context.Context, store *storage.DataStore, outPaths io.OutputFilePaths, maxDatasetSize int64, opts *outputreader.Options) (*OutputReader, error) {
	scheme, container, key, err := outPaths.GetErrorPath().Split()
	if err != nil {
		return nil, fmt.Errorf("error path %q: %w", outPaths.GetErrorPath(), err)
	}
	prefix := storage.NewDataReference(scheme, container, path.Dir(key))
	r := &OutputReader{
		RemoteFileOutputReader: ioutils.NewRemoteFileOutputReader(ctx, store, outPaths, maxDatasetSize),
		src:                    NewDataStoreSource(store, prefix),
		opts:                   opts,
		prefix:                 prefix,
	}
	if opts != nil {
		r.timeout = opts.CallTimeout
	}
	return r, nil
}

// within runs call bounded by the reader's timeout (outputreader.CallWithin).
func within[T any](r *OutputReader, ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	if r.timeout <= 0 {
		return call(ctx)
	}
	return outputreader.CallWithin(ctx, r.timeout, call)
}

// Exists is upstream's, bounded.
func (r *OutputReader) Exists(ctx context.Context) (bool, error) {
	return within(r, ctx, r.RemoteFileOutputReader.Exists)
}

// DeckExists is upstream's, bounded.
func (r *OutputReader) DeckExists(ctx context.Context) (bool, error) {
	return within(r, ctx, r.RemoteFileOutputReader.DeckExists)
}

// Read is upstream's reading of the outputs, bounded.
func (r *OutputReader) Read(ctx context.Context) (*core.LiteralMap, *io.ExecutionError, error) {
	type outputs struct {
		m  *core.LiteralMap
		ee *io.ExecutionError
	}
	o, err := within(r, ctx, func(ctx context.Context) (outputs, error) {
		m, ee, err := r.RemoteFileOutputReader.Read(ctx)
		return outputs{m, ee}, err
	})
	return o.m, o.ee, err
}

// Source is the error-document source the reader uses, for callers that
// wait (WaitFor) or merge synthesized failures themselves.
func (r *OutputReader) Source() outputreader.Source { return r.src }

// IsError reports whether any error document exists, from one listing.
func (r *OutputReader) IsError(ctx context.Context) (bool, error) {
	return outputreader.HasDocuments(ctx, outputreader.WithCallTimeout(r.src, r.timeout))
}

// ReadError returns the root cause (see ExecutionError), read with
// outputreader.Summarize, whose memory does not grow with the number of
// documents, each storage call bounded by opts.CallTimeout. Without one it
// returns upstream's codes: CodeNoDocuments when there are no documents,
// CodeUnreadableDocuments when none could be used; both recoverable, SYSTEM.
func (r *OutputReader) ReadError(ctx context.Context) (io.ExecutionError, error) {
	rep, err := outputreader.Summarize(ctx, r.src, r.opts)
	if err != nil {
		return io.ExecutionError{}, err
	}
	if ee := ExecutionError(rep); ee != nil {
		return *ee, nil
	}
	return noRootCause(rep, string(r.prefix)), nil
}
