package flyteio

import (
	"context"
	"fmt"
	"path"

	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/io"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/ioutils"
	"github.com/flyteorg/flyte/flytestdlib/storage"

	"github.com/kfelastic/kfelastic/outputreader"
)

// OutputReader implements flyteplugins' io.OutputReader. Errors come from
// Read over the DataStore, in the directory of outPaths.GetErrorPath() (where
// flytekit writes error.pb and its error-<uuid>.pb files); outputs, decks and
// their size limits are upstream's ioutils.RemoteFileOutputReader, embedded.
type OutputReader struct {
	ioutils.RemoteFileOutputReader
	src    outputreader.Source
	opts   *outputreader.Options
	prefix storage.DataReference
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
	return &OutputReader{
		RemoteFileOutputReader: ioutils.NewRemoteFileOutputReader(ctx, store, outPaths, maxDatasetSize),
		src:                    NewDataStoreSource(store, prefix),
		opts:                   opts,
		prefix:                 prefix,
	}, nil
}

// Source is the error-document source the reader uses, for callers that
// wait (WaitFor) or merge synthesized failures themselves.
func (r *OutputReader) Source() outputreader.Source { return r.src }

// IsError reports whether any error document exists, from one listing.
func (r *OutputReader) IsError(ctx context.Context) (bool, error) {
	return outputreader.HasDocuments(ctx, r.src)
}

// ReadError returns the root cause (see ExecutionError), read with
// outputreader.Summarize, whose memory does not grow with the number of
// documents. Without one
// it returns upstream's codes: CodeNoDocuments when there are no documents,
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
