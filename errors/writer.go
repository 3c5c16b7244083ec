package errors

import (
	"cmp"
	"context"
	goerrors "errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

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
//
// A file:// URL must name an absolute path (CheckURL). Its bucket writes
// each object's temporary file next to the object, never in os.TempDir:
// fileblob's default renames that file into place, which fails (EXDEV)
// whenever the prefix and /tmp are on different file systems, a tmpfs /tmp
// and a disk for the outputs being a common machine.
//
// A file:// prefix that is a symbolic link is opened where it leads (the
// listing walks the folder itself, which it would not do through a link),
// and one that cannot be read is refused here, rather than listed as empty.
func OpenPrefix(ctx context.Context, rawURL string, create bool) (*blob.Bucket, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "file" {
		if real, err := filepath.EvalSymlinks(u.Path); err == nil {
			u.Path = real
		}
		if !create {
			if err := readableDir(u.Path); err != nil {
				return nil, fmt.Errorf("%q: %w", rawURL, err)
			}
		}
		q := u.Query()
		if create {
			q.Set("create_dir", "true")
		}
		q.Set("metadata", "skip")
		q.Set("no_tmp_dir", "true")
		u.RawQuery = q.Encode()
		b, err := blob.OpenBucket(ctx, u.String())
		if err != nil {
			return nil, fmt.Errorf("%q: %w", rawURL, err)
		}
		return b, nil
	}
	prefix := strings.Trim(u.Path, "/")
	u.Path, u.RawPath = "", ""
	b, err := blob.OpenBucket(ctx, u.String())
	if err != nil {
		return nil, fmt.Errorf("%q: %w", rawURL, err)
	}
	if prefix == "" {
		return b, nil
	}
	return blob.PrefixedBucket(b, prefix+"/"), nil
}

// FileURL is the file:// URL of a local folder, escaped so that any name
// survives (a "#" or "?" in "file://"+path would end the path there: two
// jobs under /runs/a#1 and /runs/a#2 would share /runs/a). A relative path
// is made absolute first.
func FileURL(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs)}).String(), nil
}

// IsPartialWrite reports whether key names the temporary file of a write
// into a file:// prefix that has not finished, or never will (its process
// was killed): fileblob writes "<key>.<hex nanoseconds>.tmp" next to the
// object, then renames it (OpenPrefix). Listings skip such keys without
// reporting them.
func IsPartialWrite(key string) bool {
	rest, ok := strings.CutSuffix(key, ".tmp")
	if !ok {
		return false
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 || i == len(rest)-1 {
		return false
	}
	for _, c := range rest[i+1:] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// CheckURL refuses a URL that OpenPrefix would refuse before any I/O, and a
// file:// URL whose meaning is ambiguous: file://outputs/x (two slashes)
// reads "outputs" as a host and would open /x, so two jobs told
// file://stateA and file://stateB would share the root folder; file:x and
// file://./x are relative to whatever folder the process runs in. A file
// URL must be file:///absolute/path (or file://localhost/absolute/path).
// Commands check their URL flags with it when they start.
func CheckURL(rawURL string) error {
	_, err := parseURL(rawURL)
	return err
}

func parseURL(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", rawURL, err)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("%q: not a URL (want file:///absolute/path, s3://bucket/prefix, mem://)", rawURL)
	}
	if u.Scheme != "file" {
		return u, nil
	}
	switch {
	case u.Opaque != "":
		return nil, fmt.Errorf("%q: a relative file URL (it would depend on the current folder); write file:///absolute/path", rawURL)
	case u.Host != "" && u.Host != "localhost":
		return nil, fmt.Errorf("%q: %q is read as a host, and the path is %q; write file:///absolute/path (three slashes)", rawURL, u.Host, cmp.Or(u.Path, "/"))
	case u.Path == "" || !filepath.IsAbs(u.Path):
		return nil, fmt.Errorf("%q: no absolute path; write file:///absolute/path (three slashes)", rawURL)
	case u.Fragment != "" || strings.HasSuffix(rawURL, "#"):
		return nil, fmt.Errorf("%q: the path ends at \"#\" (a fragment, which a file:///absolute/path does not have); escape it as %%23", rawURL)
	}
	// Checked here, before OpenPrefix adds its own: fileblob's error for
	// an unknown parameter lists the whole query, parameters the user
	// never wrote (metadata=skip&no_tmp_dir=true) among them.
	for _, k := range slices.Sorted(maps.Keys(u.Query())) {
		if !slices.Contains(fileURLParams, k) {
			return nil, fmt.Errorf("%q: unknown query parameter %q (a file:// prefix takes %s; escape a \"?\" in the path as %%3F)",
				rawURL, k, strings.Join(fileURLParams, ", "))
		}
	}
	return u, nil
}

// fileURLParams are the query parameters a file:// URL may carry, the ones
// gocloud.dev's fileblob knows.
var fileURLParams = []string{"base_url", "create_dir", "dir_file_mode", "metadata", "no_tmp_dir", "secret_key_path"}

// Irregular says why a listed object is not a document anyone should open,
// or "" when it may be one. Only file:// buckets tell (fileblob lists with
// lstat): a symbolic link is never followed (it may lead out of the prefix,
// into a loop, or to a document listed already), and a FIFO or device is
// never opened (a read could block on it).
func Irregular(obj *blob.ListObject) string {
	var fi os.FileInfo
	if !obj.As(&fi) || fi.Mode().IsRegular() {
		return ""
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return "a symbolic link, not followed"
	}
	return "not a regular file (" + fi.Mode().Type().String() + ")"
}

// EntryError reports whether err, from opening or reading one listed
// object, is about that entry alone: access denied by the store, or the file
// system's refusal of the file (a permission, a loop, a directory in its
// place). A reader skips such an entry; any other error is the store's own
// and fails the read, since skipping for it could hide the root cause.
func EntryError(err error) bool {
	var pathErr *fs.PathError
	return gcerrors.Code(err) == gcerrors.PermissionDenied || goerrors.As(err, &pathErr)
}

// readableDir fails unless dir is a folder this process can list.
func readableDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != nil && err != io.EOF {
		return err
	}
	return nil
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

// maxLabelBytes caps a document's code and worker when the whole would
// be over DefaultMaxDocumentBytes.
const maxLabelBytes = 4 << 10

// ErrExists is what Put returns, wrapped, when an object of that name exists
// already, and WriteNew when every name it tried did.
var ErrExists = goerrors.New("object exists")

// Prepare encodes f, its message capped, as Write would store it, and names
// it (DocumentKey with a fresh RandomSuffix). A caller that must retry an upload
// whose outcome it does not know (a timeout) Puts the same key and bytes
// again, so that a retry never stores the document twice.
func (w *Writer) Prepare(f Failure) (key string, data []byte, err error) {
	data, err = Encode(f.Document(w.messageCap))
	if err == nil && len(data) > DefaultMaxDocumentBytes {
		// Readers skip what is over their limit: what is written stays
		// under it, the head and tail of each text kept, the cut said.
		key := DocumentKey(f, RandomSuffix())
		f.Code, f.Worker = CapMessage(f.Code, maxLabelBytes), CapMessage(f.Worker, maxLabelBytes)
		data, err = Encode(f.Document(DefaultMaxDocumentBytes / 2))
		if err == nil {
			return key, data, nil
		}
	}
	if err != nil {
		return "", nil, fmt.Errorf("encode error document: %w", err)
	}
	return DocumentKey(f, RandomSuffix()), data, nil
}

// Put stores data under key, conditionally (IfNotExist): an existing object
// is never replaced, and its existence is an error wrapping ErrExists.
func (w *Writer) Put(ctx context.Context, key string, data []byte) error {
	if err := putNew(ctx, w.bucket, key, data, "application/octet-stream"); err != nil {
		return fmt.Errorf("write error document %s: %w", key, err)
	}
	return nil
}

// Write stores f under a new error-<ns>-<worker>-<random>.pb key and returns
// the key. The write is conditional (IfNotExist): an existing document is
// never replaced, and a name collision is retried with a fresh suffix.
func (w *Writer) Write(ctx context.Context, f Failure) (string, error) {
	key, data, err := w.Prepare(f)
	if err != nil {
		return "", err
	}
	first := true
	key, err = WriteNew(ctx, w.bucket, data, "application/octet-stream", func() string {
		if first {
			first = false
			return key
		}
		return DocumentKey(f, RandomSuffix())
	})
	if err != nil {
		return "", fmt.Errorf("write error document %s: %w", key, err)
	}
	return key, nil
}

// WriteNew stores data under a key from newKey and returns the key. It never
// replaces an object: the write is conditional (IfNotExist), and a key that
// exists already is retried with another from newKey, a few times; when all
// exist, the error wraps ErrExists. Error documents and the events next to
// them (package events) are written so.
func WriteNew(ctx context.Context, b *blob.Bucket, data []byte, contentType string, newKey func() string) (string, error) {
	const attempts = 3
	var key string
	for range attempts {
		key = newKey()
		if err := putNew(ctx, b, key, data, contentType); !goerrors.Is(err, ErrExists) {
			return key, err
		}
	}
	return key, fmt.Errorf("%d name collisions in a row: %w", attempts, ErrExists)
}

// putNew stores data under key unless an object of that name exists, which
// is an error wrapping ErrExists.
func putNew(ctx context.Context, b *blob.Bucket, key string, data []byte, contentType string) error {
	err := b.WriteAll(ctx, key, data, &blob.WriterOptions{
		ContentType: contentType,
		IfNotExist:  true,
	})
	if err != nil && gcerrors.Code(err) == gcerrors.FailedPrecondition {
		return ErrExists
	}
	return err
}

// ListPage is one page of bucket.ListPage, listed again when an entry
// vanished while fileblob walked the folder (a write's temporary file
// renamed into place, a document moved to superseded/): fileblob then fails
// the whole page with NotFound, which a retry of the same page gets past
// (with writers busy in the folder, after a few: the window is short, and
// each retry waits a little longer).
func ListPage(ctx context.Context, b *blob.Bucket, token []byte, size int, opts *blob.ListOptions) ([]*blob.ListObject, []byte, error) {
	const attempts = 10
	for attempt := 1; ; attempt++ {
		page, next, err := b.ListPage(ctx, token, size, opts)
		if err == nil || attempt == attempts || gcerrors.Code(err) != gcerrors.NotFound || ctx.Err() != nil {
			return page, next, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(time.Duration(attempt) * time.Millisecond):
		}
	}
}
