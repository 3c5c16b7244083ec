package errors

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// URLs
	_ "gocloud.dev/blob/memblob"  // mem:// URLs
	_ "gocloud.dev/blob/s3blob"   // s3:// URLs
	"gocloud.dev/gcerrors"
)

// OpenPrefix opens the output prefix named by a gocloud.dev URL as a bucket
// whose keys are relative to it: s3://bucket/path/to/outputs?endpoint=…
// opens bucket "bucket" under "path/to/outputs/"; file:///dir opens the
// directory itself (created when create is true). The caller closes it.
func OpenPrefix(ctx context.Context, rawURL string, create bool) (*blob.Bucket, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("error prefix %q: %w", rawURL, err)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("error prefix %q: not a URL (want file://, s3://, mem://, …)", rawURL)
	}
	if u.Scheme == "file" {
		q := u.Query()
		if create {
			q.Set("create_dir", "true")
		}
		q.Set("metadata", "skip")
		u.RawQuery = q.Encode()
		b, err := blob.OpenBucket(ctx, u.String())
		if err != nil {
			return nil, fmt.Errorf("error prefix %q: %w", rawURL, err)
		}
		return b, nil
	}
	prefix := strings.Trim(u.Path, "/")
	u.Path, u.RawPath = "", ""
	b, err := blob.OpenBucket(ctx, u.String())
	if err != nil {
		return nil, fmt.Errorf("error prefix %q: %w", rawURL, err)
	}
	if prefix == "" {
		return b, nil
	}
	return blob.PrefixedBucket(b, prefix+"/"), nil
}

// Writer writes error documents under a prefix, never overwriting one.
type Writer struct {
	bucket     *blob.Bucket
	messageCap int
}

// WriterOptions tunes a Writer; nil means defaults.
type WriterOptions struct {
	// MessageCap caps messages in bytes; DefaultMessageCap when ≤ 0.
	MessageCap int
}

// NewWriter writes into bucket (see OpenPrefix). It does not own the bucket.
func NewWriter(bucket *blob.Bucket, opts *WriterOptions) *Writer {
	w := &Writer{bucket: bucket}
	if opts != nil {
		w.messageCap = opts.MessageCap
	}
	return w
}

// Write stores f under a new error-<ns>-<worker>-<random>.pb key and returns
// the key. The write is conditional (IfNotExist): an existing document is
// never replaced, and a name collision is retried with a fresh suffix.
func (w *Writer) Write(ctx context.Context, f Failure) (string, error) {
	data, err := Encode(f.Document(w.messageCap))
	if err != nil {
		return "", fmt.Errorf("encode error document: %w", err)
	}
	key, err := WriteNew(ctx, w.bucket, data, "application/octet-stream", func() string { return NewKey(f.Time, f.Worker, RandomSuffix()) })
	if err != nil {
		return "", fmt.Errorf("write error document %s: %w", key, err)
	}
	return key, nil
}

// WriteNew stores data under a key from newKey and returns the key. It never
// replaces an object: the write is conditional (IfNotExist), and a key that
// exists already is retried with another from newKey, a few times. Error
// documents and the events next to them (package events) are written so.
func WriteNew(ctx context.Context, b *blob.Bucket, data []byte, contentType string, newKey func() string) (string, error) {
	const attempts = 3
	var key string
	for range attempts {
		key = newKey()
		err := b.WriteAll(ctx, key, data, &blob.WriterOptions{
			ContentType: contentType,
			IfNotExist:  true,
		})
		if err == nil {
			return key, nil
		}
		if gcerrors.Code(err) != gcerrors.FailedPrecondition {
			return key, err
		}
	}
	return key, fmt.Errorf("%d name collisions in a row", attempts)
}
