package errors

import (
	goerrors "errors"
	"fmt"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"google.golang.org/protobuf/proto"
)

// Reasons a stored document is unusable. Readers skip such documents and
// count them; they never fail the whole read (DESIGN.md §3).
var (
	ErrEmpty        = goerrors.New("empty error document")
	ErrTooLarge     = goerrors.New("error document too large")
	ErrCorrupt      = goerrors.New("corrupt error document")
	ErrMissingError = goerrors.New("error document without error")
)

// DefaultMaxDocumentBytes bounds what a reader accepts as one document.
const DefaultMaxDocumentBytes = 1 << 20

// Encode serializes a document deterministically.
func Encode(doc *core.ErrorDocument) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(doc)
}

// Decode parses a stored document. maxBytes ≤ 0 means DefaultMaxDocumentBytes.
// It rejects what the proto decoder would silently accept as an empty
// document: no bytes, or no ContainerError.
func Decode(data []byte, maxBytes int) (*core.ErrorDocument, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxDocumentBytes
	}
	switch {
	case len(data) == 0:
		return nil, ErrEmpty
	case len(data) > maxBytes:
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), maxBytes)
	}
	doc := &core.ErrorDocument{}
	if err := proto.Unmarshal(data, doc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if doc.GetError() == nil {
		return nil, ErrMissingError
	}
	return doc, nil
}

// DecodeFailure is Decode followed by FromDocument.
func DecodeFailure(data []byte, maxBytes int) (Failure, error) {
	doc, err := Decode(data, maxBytes)
	if err != nil {
		return Failure{}, err
	}
	return FromDocument(doc)
}
