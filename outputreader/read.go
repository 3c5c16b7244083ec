package outputreader

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// Options tunes Read and WaitFor; nil means defaults.
type Options struct {
	// Concurrency bounds concurrent document reads; default 32.
	Concurrency int
	// MaxDocumentBytes: larger documents are skipped (ErrTooLarge); default
	// kferrors.DefaultMaxDocumentBytes.
	MaxDocumentBytes int
	// MessageCap caps the root cause's message, in bytes; default
	// kferrors.DefaultMessageCap.
	MessageCap int
	// PollInterval is how often WaitFor lists again; default 500ms.
	PollInterval time.Duration
	// Now is the clock; it dates documents no time can be found for (see
	// TimeFromListing). Default time.Now.
	Now func() time.Time
	// OpenAll reads every document instead of only the earliest time-named
	// ones, so that every Document has its code (the CLI's table wants them).
	// The root cause is the same either way.
	OpenAll bool
	// CallTimeout bounds each call to the Source: one listing (all its
	// pages) or one document read (see WithCallTimeout); 0: no bound. A
	// store that accepts connections and never answers fails the Read
	// within it (ErrNoAnswer) instead of hanging it.
	CallTimeout time.Duration
}

func (o *Options) withDefaults() Options {
	var d Options
	if o != nil {
		d = *o
	}
	if d.Concurrency <= 0 {
		d.Concurrency = 32
	}
	if d.MaxDocumentBytes <= 0 {
		d.MaxDocumentBytes = kferrors.DefaultMaxDocumentBytes
	}
	if d.MessageCap <= 0 {
		d.MessageCap = kferrors.DefaultMessageCap
	}
	if d.PollInterval <= 0 {
		d.PollInterval = 500 * time.Millisecond
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	return d
}

// TimeSource says where a Document's ranking time (At) comes from.
type TimeSource uint8

const (
	// TimeFromDocument: the document's own timestamp.
	TimeFromDocument TimeSource = iota
	// TimeFromModified: the document has no timestamp (legacy error.pb, old
	// flytekit); its object's modification time stands in, never 1970.
	TimeFromModified
	// TimeFromListing: neither a timestamp nor a modification time (the
	// DataStore backend tells none, or a synthesized failure without time):
	// the time Read listed it, which ranks it after every dated failure.
	TimeFromListing
	// TimeFromName: the document was not opened. It is one of our own
	// error-<ns>-<worker>-<rand>.pb documents, ranked by the time in its name,
	// which is later than the root cause's time. Its Code, Origin and
	// Recoverable are unknown and its Worker is the sanitized worker of the
	// name (kferrors.SanitizeWorker).
	TimeFromName
	// TimeFromModifiedClamped: the document's timestamp is later than its
	// object's modification time, which ranks it instead. A failure cannot
	// have happened after its document was written: the writer's clock ran
	// ahead of the store's (Failure.Time keeps what the document said).
	TimeFromModifiedClamped
)

func (s TimeSource) String() string {
	switch s {
	case TimeFromDocument:
		return "document"
	case TimeFromModified:
		return "modified"
	case TimeFromListing:
		return "listing"
	case TimeFromName:
		return "name"
	case TimeFromModifiedClamped:
		return "clamped"
	}
	return fmt.Sprintf("TimeSource(%d)", uint8(s))
}

// Document is the small per-document summary kept in memory.
type Document struct {
	// Key is the object key relative to the prefix ("" for synthesized).
	Key string
	// Failure as decoded. Message is kept only for the root cause.
	Failure kferrors.Failure
	// Modified is the object's modification time, zero when the backend does
	// not tell (it stands in for a missing timestamp).
	Modified time.Time
	// Synthesized: made from a pod status, not read from storage.
	Synthesized bool
	// At is the time the document is ranked by, and AtSource where it comes
	// from: the document's timestamp, else its modification time, else the
	// listing time; for a document that was not opened, its name's time.
	At       time.Time
	AtSource TimeSource
	// Exception is, for flytekit's wrapper code, the exception it stands
	// for (WrappedException), kept when the message is not.
	Exception string
	// Unreadable, when set, is why the document could not be read (it
	// wraps kferrors.ErrCorrupt, ErrEmpty, ErrTooLarge, ErrMissingError or
	// ErrUnreadable). It still counts as a failure of the pod that wrote
	// it: Failure is made from what could be read (code
	// kferrors.CodeUnreadableDocument, the worker its name or bytes
	// carry, a message saying which document, its size, why and what it
	// said), ranked by its write time (TimeFromModified, an upper bound),
	// else the listing time. It is listed in Skipped as well.
	Unreadable error
}

// Time is the time d is ranked by: At, else its Failure's time, else its
// modification time; zero if none is known.
func (d Document) Time() time.Time {
	switch {
	case !d.At.IsZero():
		return d.At
	case !d.Failure.Time.IsZero():
		return d.Failure.Time
	}
	return d.Modified
}

// Opened reports whether the document was read, i.e. its Code, Origin and
// Recoverable are known.
func (d Document) Opened() bool { return d.AtSource != TimeFromName }

// Less is the total order of failures (docs/DESIGN.md §3): time, then worker, then
// key. A document without any time sorts after every dated one, never as 1970.
func Less(a, b Document) bool { return compare(a, b) < 0 }

func compare(a, b Document) int {
	ta, tb := a.Time(), b.Time()
	if ta.IsZero() != tb.IsZero() {
		if ta.IsZero() {
			return 1
		}
		return -1
	}
	if c := ta.Compare(tb); c != 0 {
		return c
	}
	if c := strings.Compare(a.Failure.Worker, b.Failure.Worker); c != 0 {
		return c
	}
	return strings.Compare(a.Key, b.Key)
}

// HardwareWindow is kferrors.HardwareWindow: how long after a peer's
// secondary failure a hardware fault still explains it.
const HardwareWindow = kferrors.HardwareWindow

// explains reports whether hardware fault hw stands for the earliest
// failure first in the root cause: first is a peer's secondary symptom, and
// hw came at most HardwareWindow after it (both dated).
func explains(hw, first Document) bool {
	return kferrors.IsSecondaryCode(first.Failure.Code) && kferrors.IsHardwareCode(hw.Failure.Code) &&
		!first.Time().IsZero() && !hw.Time().IsZero() && !hw.Time().After(first.Time().Add(HardwareWindow))
}

// Skipped is a document Read could not use; Err wraps kferrors.ErrCorrupt,
// ErrEmpty, ErrTooLarge, ErrMissingError, ErrNotFound (vanished) or
// ErrUnreadable (a link, a special file, no access). Each but a vanished
// one is a failure too (Document.Unreadable): its pod wrote a document, so
// its pod failed. A vanished document was moved aside (superseded/,
// refined/) or deleted after the listing: it counts for nothing.
type Skipped struct {
	Key string
	Err error
}

// Report is the outcome of Read.
type Report struct {
	// RootCause is the earliest failure by Less, with its (capped) message,
	// unless that is a peer's secondary failure that the earliest hardware
	// fault explains (HardwareWindow): then that fault. nil when there is
	// no usable document at all: the distinct "no documents" result.
	RootCause *Document
	// Displaced is the earliest failure when a hardware fault stands for it
	// as the root cause (a peer's NCCL error; without its message, and
	// among Others too); nil otherwise.
	Displaced *Document
	// Others are every other failure, in the total order, without messages.
	Others []Document
	// Skipped are the unusable documents, by key. Those not vanished are
	// failures in RootCause or Others too (Document.Unreadable).
	Skipped []Skipped
	// Opened counts the documents actually read (the rest were ranked by
	// name, see TimeFromName).
	Opened int
	// listedAt is when Read listed (see TimeFromListing), for Summary.Merge.
	listedAt time.Time
}

// Workers is the number of distinct workers with a document, synthesized ones
// included. Workers are compared sanitized (kferrors.SanitizeWorker), the form
// a not-opened document's name carries; documents without a worker count as
// one "unknown" worker.
func (r *Report) Workers() int {
	seen := map[string]struct{}{}
	if r.RootCause != nil {
		seen[kferrors.SanitizeWorker(r.RootCause.Failure.Worker)] = struct{}{}
	}
	for _, d := range r.Others {
		seen[kferrors.SanitizeWorker(d.Failure.Worker)] = struct{}{}
	}
	return len(seen)
}

// listed is what the listing tells of one document.
type listed struct {
	key      string
	size     int64 // -1 when the listing does not say
	modified time.Time
	nameTime time.Time // zero unless the key is one of our time-named keys
}

// Read lists and reads every document under src and merges extra
// (synthesized) failures, then picks the root cause by the total order Less.
//
// It does not read every document. Our writers name documents
// error-<19-digit ns>-<worker>-<rand>.pb with the document's own timestamp,
// so the listing orders them. Read opens every document named otherwise
// (flytekit's error-<uuid>.pb, the legacy error.pb: their names carry no
// time), the first Concurrency time-named ones, and then further time-named
// ones in key order, a batch at a time, as long as the next name's time is not
// after the earliest time decoded so far (extra failures included). The
// documents left are ranked by their names (TimeFromName) and appear in
// Others without code. This is exact under one assumption, which our writer
// guarantees: a document's time is never earlier than the time in its name (a
// later one does no harm: the document is opened and ranked by its own time).
// Which documents are opened depends only on the stored data, so the Report
// is the same on every Read of the same data.
//
// Empty documents and unusable entries known from the listing are not
// read; of a document the listing says is too large only the head is.
// Corrupt, empty, oversized, vanished and unreadable documents
// (ErrUnreadable: one bad entry) are skipped and reported, and every one
// but a vanished one counts as a failure of its pod (Document.Unreadable),
// ranked by its write time; an error of the store itself (a listing that
// fails, no answer within Options.CallTimeout) fails the Read.
func Read(ctx context.Context, src Source, opts *Options, extra ...kferrors.Failure) (*Report, error) {
	o := opts.withDefaults()
	src = WithCallTimeout(src, o.CallTimeout)
	listedAt := o.Now().UTC()
	c := &collector{messageCap: o.MessageCap}
	var named, unnamed []listed
	var skipped []Skipped
	err := src.List(ctx, func(obj Object) error {
		if err := listingProblem(obj); err != nil {
			skipped = append(skipped, Skipped{Key: obj.Key, Err: err})
			c.add(unreadableDocument(listedObject(obj), obj.Size, nil, err, listedAt))
			return nil
		}
		if l := listedObject(obj); !l.nameTime.IsZero() {
			named = append(named, l)
		} else {
			unnamed = append(unnamed, l)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Fixed-width nanoseconds: key order is time order.
	slices.SortFunc(named, func(a, b listed) int { return strings.Compare(a.key, b.key) })

	for _, f := range extra {
		c.add(synthesizedDocument(f, listedAt))
	}

	// First round: everything that must be opened, plus the earliest names.
	first := min(o.Concurrency, len(named))
	if o.OpenAll {
		first = len(named)
	}
	if err := c.open(ctx, src, o, listedAt, append(unnamed, named[:first]...)); err != nil {
		return nil, err
	}
	next := first
	for next < len(named) {
		best, ok := c.bestTime()
		end := next
		for end < len(named) && end-next < o.Concurrency && (!ok || !named[end].nameTime.After(best)) {
			end++
		}
		if end == next {
			break // every name left is later than the root cause
		}
		if err := c.open(ctx, src, o, listedAt, named[next:end]); err != nil {
			return nil, err
		}
		next = end
	}
	c.docs = slices.Grow(c.docs, len(named)-next)
	for _, l := range named[next:] {
		c.docs = append(c.docs, Document{
			Key:      l.key,
			Failure:  kferrors.Failure{Worker: kferrors.WorkerFromKey(l.key), Time: l.nameTime},
			Modified: l.modified,
			At:       l.nameTime,
			AtSource: TimeFromName,
		})
	}
	skipped = append(skipped, c.skipped...)
	slices.SortFunc(skipped, func(a, b Skipped) int { return strings.Compare(a.Key, b.Key) })
	r := c.report(skipped)
	r.listedAt = listedAt
	return r, nil
}

// collector keeps the summaries and the messages worth keeping: the
// current best's, and the earliest hardware fault's (HardwareWindow).
type collector struct {
	messageCap int
	mu         sync.Mutex
	docs       []Document // messages cleared
	best       int        // index into docs of the best so far, if hasBest
	bestMsg    string
	hasBest    bool
	hw         int // index into docs of the earliest hardware fault, if hasHW
	hwMsg      string
	hasHW      bool
	skipped    []Skipped
	opened     int
}

func (c *collector) add(d Document) {
	c.mu.Lock()
	defer c.mu.Unlock()
	msg := d.Failure.Message
	if exc, _, ok := WrappedException(d.Failure.Code, msg); ok {
		d.Exception = exc
	}
	d.Failure.Message = ""
	c.docs = append(c.docs, d)
	if !c.hasBest || compare(d, c.docs[c.best]) < 0 {
		c.best, c.hasBest = len(c.docs)-1, true
		c.bestMsg = kferrors.CapMessage(msg, c.messageCap)
	}
	if kferrors.IsHardwareCode(d.Failure.Code) && (!c.hasHW || compare(d, c.docs[c.hw]) < 0) {
		c.hw, c.hasHW = len(c.docs)-1, true
		c.hwMsg = kferrors.CapMessage(msg, c.messageCap)
	}
}

func (c *collector) skip(key string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.skipped = append(c.skipped, Skipped{Key: key, Err: err})
}

func (c *collector) bestTime() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.hasBest {
		return time.Time{}, false
	}
	return c.docs[c.best].Time(), true
}

// open reads and decodes batch with at most o.Concurrency reads in flight.
func (c *collector) open(ctx context.Context, src Source, o Options, listedAt time.Time, batch []listed) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Concurrency)
	for _, l := range batch {
		g.Go(func() error {
			d, skip, read, err := openDocument(gctx, src, o, listedAt, l)
			if err != nil {
				return err
			}
			if read {
				c.mu.Lock()
				c.opened++
				c.mu.Unlock()
			}
			if skip != nil {
				c.skip(skip.Key, skip.Err)
			}
			if skip == nil || d.Unreadable != nil {
				c.add(d)
			}
			return nil
		})
	}
	return g.Wait()
}

func (c *collector) report(skipped []Skipped) *Report {
	r := &Report{Skipped: skipped, Opened: c.opened}
	if !c.hasBest {
		return r
	}
	at, msg := c.best, c.bestMsg
	if c.hasHW && explains(c.docs[c.hw], c.docs[c.best]) {
		displaced := c.docs[c.best]
		r.Displaced = &displaced
		at, msg = c.hw, c.hwMsg
	}
	root := c.docs[at]
	root.Failure.Message = msg
	r.RootCause = &root
	// In place: the summaries are the only per-document memory; no copy.
	r.Others = slices.Delete(c.docs, at, at+1)
	c.docs = nil
	slices.SortStableFunc(r.Others, compare)
	return r
}
