package flyteio

import (
	"fmt"
	"strings"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/io"
	"google.golang.org/protobuf/types/known/timestamppb"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Codes for a task without a root cause, as upstream's reader names them.
const (
	// CodeNoDocuments: no error document at all under the prefix.
	CodeNoDocuments = "ErrorFileNotFound"
	// CodeUnreadableDocuments: documents were listed, none could be used:
	// every one vanished while read (an unreadable one is a failure of its
	// own, outputreader.Document.Unreadable).
	CodeUnreadableDocuments = "ErrorFileBadFormat"
)

// ExecutionError is the root cause as flyteplugins reports a task failure:
// Code, Message (= r.Message()), Kind (the origin, USER or SYSTEM), Timestamp
// and Worker of the root cause; IsRecoverable follows its kind. It is nil
// when there is no root cause. A full Report gives the same through
// Report.Summary.
func ExecutionError(r *outputreader.Summary) *io.ExecutionError {
	if r.RootCause == nil {
		return nil
	}
	root := r.RootCause
	return &io.ExecutionError{
		ExecutionError: &core.ExecutionError{
			Code:      root.Failure.Code,
			Message:   r.Message(),
			Kind:      root.Failure.Origin,
			Timestamp: timestamppb.New(root.Time()),
			Worker:    root.Failure.Worker,
		},
		IsRecoverable: root.Failure.Recoverable,
	}
}

// noRootCause is the ExecutionError for a Summary without a root cause:
// recoverable and of SYSTEM origin, as upstream reports a missing error file.
// It names the first skipped documents and says how many more there are.
func noRootCause(r *outputreader.Summary, prefix string) io.ExecutionError {
	code, msg := CodeNoDocuments, fmt.Sprintf("no error documents under %s", prefix)
	if r.Skipped > 0 {
		code = CodeUnreadableDocuments
		var keys []string
		for _, s := range r.SkippedSample {
			keys = append(keys, fmt.Sprintf("%s (%v)", s.Key, s.Err))
		}
		if more := r.Skipped - len(r.SkippedSample); more > 0 {
			keys = append(keys, fmt.Sprintf("and %d more", more))
		}
		msg = fmt.Sprintf("%s under %s, none usable: %s", documents(r.Skipped), prefix, strings.Join(keys, "; "))
		msg = kferrors.CapMessage(msg, kferrors.DefaultMessageCap)
	}
	return io.ExecutionError{
		ExecutionError: &core.ExecutionError{Code: code, Message: msg, Kind: core.ExecutionError_SYSTEM},
		IsRecoverable:  true,
	}
}

func documents(n int) string {
	if n == 1 {
		return "1 error document"
	}
	return fmt.Sprintf("%d error documents", n)
}
