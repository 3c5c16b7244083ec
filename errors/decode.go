package errors

import (
	"context"
	goerrors "errors"
	"fmt"
	"io"
	"strings"

	"gocloud.dev/blob"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Reasons a stored document is unusable. Readers skip such documents and
// count them; they never fail the whole read (docs/DESIGN.md §3).
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
		// proto3 refuses a string field that is not UTF-8, and with it the
		// whole document. A worker that wrote its message in another
		// encoding (a Latin-1 traceback, a cut multi-byte character) still
		// failed, at that time, with that code: repair the strings, keep it.
		repaired, rerr := repairUTF8(data, doc.ProtoReflect().Descriptor())
		if rerr != nil || proto.Unmarshal(repaired, doc) != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
	}
	if doc.GetError() == nil {
		return nil, ErrMissingError
	}
	return doc, nil
}

// repairUTF8 re-encodes a serialized message of type md with every string
// field, at any depth, made valid UTF-8 (invalid bytes become U+FFFD), and
// every other field copied as it is. It fails only on malformed wire data.
func repairUTF8(data []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	out := make([]byte, 0, len(data))
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		out = append(out, data[:n]...)
		data = data[n:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil || (fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.MessageKind) {
			m := protowire.ConsumeFieldValue(num, typ, data)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			out = append(out, data[:m]...)
			data = data[m:]
			continue
		}
		v, m := protowire.ConsumeBytes(data)
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		data = data[m:]
		if fd.Kind() == protoreflect.StringKind {
			v = []byte(strings.ToValidUTF8(string(v), "\uFFFD"))
		} else {
			var err error
			if v, err = repairUTF8(v, fd.Message()); err != nil {
				return nil, err
			}
		}
		out = protowire.AppendBytes(out, v)
	}
	return out, nil
}

// ReadDocument reads the stored document key from b, at most maxBytes of it
// (DefaultMaxDocumentBytes when ≤ 0; a larger one is ErrTooLarge): a file of
// hundreds of megabytes named like a document costs its reader nothing.
func ReadDocument(ctx context.Context, b *blob.Bucket, key string, maxBytes int) ([]byte, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxDocumentBytes
	}
	r, err := b.NewReader(ctx, key, nil)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if r.Size() > int64(maxBytes) {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, r.Size(), maxBytes)
	}
	data, err := io.ReadAll(io.LimitReader(r, int64(maxBytes)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxBytes {
		return nil, fmt.Errorf("%w: over %d bytes", ErrTooLarge, maxBytes)
	}
	return data, nil
}

// DecodeFailure is Decode followed by FromDocument.
func DecodeFailure(data []byte, maxBytes int) (Failure, error) {
	doc, err := Decode(data, maxBytes)
	if err != nil {
		return Failure{}, err
	}
	return FromDocument(doc)
}

// PartialFailure reads what it can of a document Decode refuses: one cut
// short (a reader takes only the head of one too large), or corrupt after
// some fields. It reads the ContainerError's fields in order up to the first
// it cannot, and keeps code, message and worker as far as they go (a string
// cut short is kept cut, made valid UTF-8); kind, origin and timestamp are
// left out, as nothing after a corrupt byte can be trusted to be what it
// seems. ok is false when not one of the three could be read.
func PartialFailure(data []byte) (f Failure, ok bool) {
	num, typ, n := protowire.ConsumeTag(data)
	if n < 0 || num != 1 || typ != protowire.BytesType {
		return f, false
	}
	data = data[n:]
	size, n := protowire.ConsumeVarint(data)
	if n < 0 {
		return f, false
	}
	data = data[n:]
	if uint64(len(data)) > size {
		data = data[:size]
	}
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			break
		}
		data = data[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, data); n < 0 {
				break
			}
			data = data[n:]
			continue
		}
		size, n := protowire.ConsumeVarint(data)
		if n < 0 {
			break
		}
		data = data[n:]
		v := data[:min(uint64(len(data)), size)]
		data = data[len(v):]
		s := strings.ToValidUTF8(string(v), "\uFFFD")
		switch num {
		case 1:
			f.Code = s
		case 2:
			f.Message = s
		case 6:
			f.Worker = s
		}
	}
	return f, f.Code != "" || f.Message != "" || f.Worker != ""
}
