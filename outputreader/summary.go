package outputreader

import (
	"container/heap"
	"context"
	goerrors "errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// maxSkippedSample is how many skipped documents a Summary names.
const maxSkippedSample = 16

// Summary is what the plugin needs of a task's error documents: the root
// cause, a tally of the other failures and how many documents were skipped.
// Unlike a Report it keeps nothing per document, so its size does not grow
// with their number (see Summarize). A Report gives the same Summary
// (Report.Summary), and both say the same UI message.
type Summary struct {
	// RootCause is the earliest failure by Less, with its (capped) message,
	// or the hardware fault that explains it (Report.RootCause says when);
	// nil when there is no usable document at all.
	RootCause *Document
	// Displaced is the earliest failure when a hardware fault stands for it
	// (Report.Displaced); nil otherwise.
	Displaced *Document
	// earliest and hardware are the earliest failure and the earliest
	// hardware fault, from which RootCause and Displaced are decided
	// (decide): Merge decides again with its failures.
	earliest, hardware *Document
	// Opened counts the documents actually read.
	Opened int
	// Skipped counts the unusable documents; SkippedSample names the first
	// few of them by key. Each but a vanished one is a failure as well
	// (Document.Unreadable), counted as its pod's document.
	Skipped       int
	SkippedSample []Skipped
	// vanished counts the skipped documents that vanished while read
	// (ErrNotFound), the only ones that are no failure.
	vanished int
	tally    tally
	// listedAt ranks merged failures without a usable time, as Summarize
	// and Read rank theirs.
	listedAt time.Time
}

// Message is the Flyte UI message (docs/DESIGN.md §3): the root cause headed by
// its worker and time, then one line tallying the other failures, e.g.
//
//	[job-worker-1, 2026-11-21T10:00:01.123456789Z] RuntimeError: boom
//	Also failed: 3 other workers (2× Preempted, 1× NonZeroExit). Earliest failure shown.
//
// The code is said once (kferrors.Headline); flytekit's USER:RuntimeError
// is shown as the exception it wraps (Shown). A time that is not the
// document's own says so: "(upload time)" for the object's modification
// time, "(read time)" for the listing time. It is "" without a root cause.
func (s *Summary) Message() string {
	if s.RootCause == nil {
		return ""
	}
	root := s.RootCause
	var b strings.Builder
	who := root.Failure.Worker
	if who == "" {
		who = root.Key
	}
	if who == "" {
		who = "unknown worker"
	}
	// Tracebacks end in a newline; the tally goes right under the message.
	code, msg := Shown(root.Failure.Code, root.Failure.Message)
	fmt.Fprintf(&b, "[%s, %s%s] %s", who, root.Time().UTC().Format(TimeLayout), timeNote(*root),
		kferrors.Headline(code, strings.TrimRight(msg, " \t\r\n")))
	if line := s.tally.line(*root, s.vanished, s.Displaced); line != "" {
		b.WriteString("\n")
		b.WriteString(line)
	}
	return b.String()
}

// decide sets RootCause and Displaced from earliest and hardware.
func (s *Summary) decide() {
	s.RootCause, s.Displaced = s.earliest, nil
	if s.earliest != nil && s.hardware != nil && explains(*s.hardware, *s.earliest) {
		displaced := *s.earliest
		displaced.Failure.Message = "" // as Report.Displaced: one message, the root cause's
		s.RootCause, s.Displaced = s.hardware, &displaced
	}
}

// IsRecoverable follows the root cause's kind; false without a root cause.
func (s *Summary) IsRecoverable() bool {
	return s.RootCause != nil && s.RootCause.Failure.Recoverable
}

// Documents is the number of usable documents, the root cause included.
func (s *Summary) Documents() int { return s.tally.docs }

// Workers is the number of distinct workers with a document, readable or not
// (compared sanitized, as Report.Workers does); a lower bound beyond
// MaxTallyWorkers.
func (s *Summary) Workers() int { return s.tally.workers.len() }

// Pods is the number of distinct pods with a document, readable or not
// (see PodOf; an unreadable one counts for the pod its name or bytes
// carry); a lower bound beyond MaxTallyWorkers.
func (s *Summary) Pods() int { return s.tally.pods.len() }

// HasPod reports whether pod (a pod name) or one of its workers has a
// document, readable or not: a pod that wrote one has reported, even when
// nobody can read it (Document.Unreadable). When more than MaxTallyWorkers pods have documents, a pod the
// tally had no room for is assumed to have one: with that many documents,
// waiting for or synthesizing one more cannot change the outcome's kind.
func (s *Summary) HasPod(pod string) bool {
	return s.tally.pods.has(hashName(kferrors.SanitizeWorker(pod))) || s.tally.pods.full
}

// Merge returns s with extra (synthesized) failures ranked in by Less and
// counted in the tally; s is not modified.
func (s *Summary) Merge(extra ...kferrors.Failure) *Summary {
	if len(extra) == 0 {
		return s
	}
	out := *s
	out.tally = s.tally.clone()
	for _, f := range extra {
		d := synthesizedDocument(f, s.listedAt)
		out.tally.add(d)
		if out.earliest == nil || compare(d, *out.earliest) < 0 {
			out.earliest = &d
		}
		if kferrors.IsHardwareCode(d.Failure.Code) && (out.hardware == nil || compare(d, *out.hardware) < 0) {
			out.hardware = &d
		}
	}
	out.decide()
	return &out
}

// Summary is the report's Summary: the same root cause, tally and message
// as Summarize gives for the same documents.
func (r *Report) Summary() *Summary {
	s := &Summary{Opened: r.Opened, Skipped: len(r.Skipped), listedAt: r.listedAt}
	s.earliest = r.RootCause
	switch {
	case r.Displaced != nil:
		s.earliest, s.hardware = r.Displaced, r.RootCause
	case r.RootCause != nil && kferrors.IsHardwareCode(r.RootCause.Failure.Code):
		s.hardware = r.RootCause
	default:
		// Others are in order: the first hardware fault is the earliest.
		if i := slices.IndexFunc(r.Others, func(d Document) bool { return kferrors.IsHardwareCode(d.Failure.Code) }); i >= 0 {
			hw := r.Others[i]
			s.hardware = &hw
		}
	}
	s.decide()
	s.SkippedSample = r.Skipped[:min(len(r.Skipped), maxSkippedSample)]
	for _, sk := range r.Skipped {
		if goerrors.Is(sk.Err, ErrNotFound) {
			s.vanished++
		}
	}
	if r.RootCause != nil {
		s.tally.add(*r.RootCause)
	}
	for _, d := range r.Others {
		s.tally.add(d)
	}
	return s
}

// Summarize is Read for the plugin: the same root cause, from the same
// documents opened, and the same UI message, in memory that does not grow
// with the number of documents. It streams the listing once and keeps
// tallies, the current best document and the Concurrency earliest of our
// time-named keys (a heap), never a list of documents.
//
// As Read, it opens every document named otherwise as it is listed (their
// names carry no time), then the earliest time-named ones; when the last of
// those is not later than the best time found, it lists again for the next
// ones up to that time (in practice never: our documents carry the time of
// their name). Everything else is counted by name. As Read, it skips and
// counts what it cannot use (unusable entries, empty, oversized, vanished,
// unreadable and corrupt documents) and fails only on an error of the store
// itself, each call bounded by Options.CallTimeout.
func Summarize(ctx context.Context, src Source, opts *Options, extra ...kferrors.Failure) (*Summary, error) {
	o := opts.withDefaults()
	src = WithCallTimeout(src, o.CallTimeout)
	z := &summarizer{o: o, listedAt: o.Now().UTC()}
	for _, f := range extra {
		z.consider(synthesizedDocument(f, z.listedAt))
	}
	earliest := &keyHeap{}
	named := 0
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Concurrency)
	listErr := src.List(gctx, func(obj Object) error {
		if err := gctx.Err(); err != nil {
			return err // a read failed; g.Wait tells why
		}
		l, ok := z.listed(obj)
		if !ok {
			return nil
		}
		if l.nameTime.IsZero() {
			g.Go(func() error { return z.open(gctx, src, l) })
			return nil
		}
		named++
		z.mu.Lock()
		z.tally.addName(kferrors.WorkerFromKey(l.key))
		z.mu.Unlock()
		earliest.keep(l, o.Concurrency)
		return nil
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if listErr != nil {
		return nil, listErr
	}
	batch := earliest.sorted()
	for opened := 0; len(batch) > 0; {
		if err := z.openAll(ctx, src, batch); err != nil {
			return nil, err
		}
		if opened += len(batch); opened >= named {
			break
		}
		last := batch[len(batch)-1]
		best, ok := z.bestTime()
		if ok && last.nameTime.After(best) {
			break // every name left is later than the root cause
		}
		// Names after last are in key order, which is time order.
		next := &keyHeap{}
		err := src.List(ctx, func(obj Object) error {
			// Those listed without a name time were opened already.
			if l, usable := z.peek(obj); usable && !l.nameTime.IsZero() && obj.Key > last.key && (!ok || !l.nameTime.After(best)) {
				next.keep(l, o.Concurrency)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		batch = next.sorted()
	}
	return z.summary(), nil
}

// summarizer is Summarize's state: tallies and the best document so far.
type summarizer struct {
	o        Options
	listedAt time.Time

	mu       sync.Mutex
	tally    tally
	best     *Document // message kept, capped
	hardware *Document // the earliest hardware fault, message kept, capped
	opened   int
	skipped  int
	vanished int
	sample   []Skipped // the maxSkippedSample smallest keys, sorted
}

// listed turns a listed object into a candidate, or counts it skipped when
// the listing alone shows it unusable (empty, too large).
func (z *summarizer) listed(obj Object) (listed, bool) {
	if err := listingProblem(obj); err != nil {
		z.skip(obj.Key, err)
		z.consider(unreadableDocument(listedObject(obj), obj.Size, nil, err, z.listedAt))
		return listed{}, false
	}
	return listedObject(obj), true
}

// peek is listed without counting: for a second listing of objects the
// first one counted already.
func (z *summarizer) peek(obj Object) (listed, bool) {
	if listingProblem(obj) != nil {
		return listed{}, false
	}
	return listedObject(obj), true
}

func (z *summarizer) skip(key string, err error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.skipped++
	if goerrors.Is(err, ErrNotFound) {
		z.vanished++
	}
	i, _ := slices.BinarySearchFunc(z.sample, key, func(s Skipped, k string) int { return strings.Compare(s.Key, k) })
	if i < maxSkippedSample {
		z.sample = slices.Insert(z.sample, i, Skipped{Key: key, Err: err})
		z.sample = z.sample[:min(len(z.sample), maxSkippedSample)]
	}
}

func (z *summarizer) openAll(ctx context.Context, src Source, batch []listed) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(z.o.Concurrency)
	for _, l := range batch {
		g.Go(func() error { return z.open(gctx, src, l) })
	}
	return g.Wait()
}

// open reads one document and counts it; a time-named one was counted by
// name while listed, and that count is taken back first.
func (z *summarizer) open(ctx context.Context, src Source, l listed) error {
	d, skip, read, err := openDocument(ctx, src, z.o, z.listedAt, l)
	if err != nil {
		return err
	}
	z.mu.Lock()
	if read {
		z.opened++
	}
	if !l.nameTime.IsZero() {
		z.tally.removeName(kferrors.WorkerFromKey(l.key))
	}
	z.mu.Unlock()
	if skip != nil {
		z.skip(skip.Key, skip.Err)
	}
	if skip == nil || d.Unreadable != nil {
		z.consider(d)
	}
	return nil
}

func (z *summarizer) consider(d Document) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.tally.add(d)
	best := z.best == nil || compare(d, *z.best) < 0
	hardware := kferrors.IsHardwareCode(d.Failure.Code) && (z.hardware == nil || compare(d, *z.hardware) < 0)
	if best || hardware {
		d.Failure.Message = kferrors.CapMessage(d.Failure.Message, z.o.MessageCap)
	}
	if best {
		z.best = &d
	}
	if hardware {
		z.hardware = &d
	}
}

func (z *summarizer) bestTime() (time.Time, bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.best == nil {
		return time.Time{}, false
	}
	return z.best.Time(), true
}

func (z *summarizer) summary() *Summary {
	s := &Summary{earliest: z.best, hardware: z.hardware, Opened: z.opened, Skipped: z.skipped, SkippedSample: z.sample, vanished: z.vanished, tally: z.tally,
		listedAt: z.listedAt}
	s.decide()
	return s
}

// keyHeap keeps the n smallest keys it is offered: a max-heap on key.
type keyHeap []listed

func (h keyHeap) Len() int           { return len(h) }
func (h keyHeap) Less(i, j int) bool { return h[i].key > h[j].key }
func (h keyHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *keyHeap) Push(x any)        { *h = append(*h, x.(listed)) }
func (h *keyHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (h *keyHeap) keep(l listed, n int) {
	switch {
	case h.Len() < n:
		heap.Push(h, l)
	case l.key < (*h)[0].key:
		(*h)[0] = l
		heap.Fix(h, 0)
	}
}

// sorted empties the heap into key order.
func (h *keyHeap) sorted() []listed {
	out := slices.Clone(*h)
	slices.SortFunc(out, func(a, b listed) int { return strings.Compare(a.key, b.key) })
	*h = nil
	return out
}

// listingProblem is why a listed object is unusable without reading it:
// the listing says it is no document to open (Object.Unusable: a link, a
// special file), or it is empty. One the listing says is too large is
// found so by openDocument, which reads its head for what it says.
func listingProblem(obj Object) error {
	switch {
	case obj.Unusable != nil:
		return obj.Unusable
	case obj.Size == 0:
		return kferrors.ErrEmpty
	}
	return nil
}

// listedObject is what the listing tells of obj. A time-named document
// written before the time in its name, by more than ModifiedResolution
// (its writer's clock ran ahead of the store's), may rank before its name
// once opened (TimeFromModifiedClamped): it is always opened, as a
// document named otherwise is.
func listedObject(obj Object) listed {
	l := listed{key: obj.Key, size: obj.Size, modified: obj.Modified}
	// A hardware fault's document is opened whatever its name says, as
	// one named otherwise: it may stand for earlier failures
	// (HardwareWindow), which its name's time alone cannot tell.
	if t, ok := kferrors.TimeFromKey(obj.Key); ok && !kferrors.IsHardwareKey(obj.Key) &&
		!(kferrors.UsableTime(obj.Modified) && obj.Modified.Add(ModifiedResolution).Before(t)) {
		l.nameTime = t
	}
	return l
}

// synthesizedDocument is an extra failure as a Document: a time that is not
// usable (zero, 1970, out of range) is no time, and the listing time ranks it.
func synthesizedDocument(f kferrors.Failure, listedAt time.Time) Document {
	d := Document{Failure: f, Synthesized: true, At: f.Time, AtSource: TimeFromDocument}
	if !kferrors.UsableTime(f.Time) {
		d.Failure.Time = time.Time{}
		d.At, d.AtSource = listedAt, TimeFromListing
	}
	return d
}

// openDocument reads and decodes one listed document. read reports whether
// the bytes were read; an unusable document (vanished, unreadable, too
// large, corrupt) comes back as skip, and, unless it vanished, d is the
// failure it stands for (unreadableDocument: d.Unreadable is set); err is
// for the failures that fail a whole read. Of a document the listing says
// is too large only the head is read (that read does not count as read).
func openDocument(ctx context.Context, src Source, o Options, listedAt time.Time, l listed) (d Document, skip *Skipped, read bool, err error) {
	if l.size > int64(o.MaxDocumentBytes) {
		why := fmt.Errorf("%w: %d bytes, limit %d", kferrors.ErrTooLarge, l.size, o.MaxDocumentBytes)
		head, err := src.Read(ctx, l.key, unreadableHeadBytes)
		switch {
		case goerrors.Is(err, ErrNotFound):
			return Document{}, &Skipped{Key: l.key, Err: err}, false, nil
		case goerrors.Is(err, ErrUnreadable):
			head = nil
		case err != nil:
			return Document{}, nil, false, fmt.Errorf("read error document %s under %s: %w", l.key, src, err)
		}
		head = head[:min(len(head), unreadableHeadBytes)]
		return unreadableDocument(l, l.size, head, why, listedAt), &Skipped{Key: l.key, Err: why}, false, nil
	}
	data, err := src.Read(ctx, l.key, o.MaxDocumentBytes)
	switch {
	case goerrors.Is(err, ErrNotFound):
		return Document{}, &Skipped{Key: l.key, Err: err}, false, nil
	case goerrors.Is(err, ErrUnreadable), goerrors.Is(err, kferrors.ErrTooLarge):
		return unreadableDocument(l, l.size, nil, err, listedAt), &Skipped{Key: l.key, Err: err}, false, nil
	case err != nil:
		return Document{}, nil, false, fmt.Errorf("read error document %s under %s: %w", l.key, src, err)
	}
	f, err := kferrors.DecodeFailure(data, o.MaxDocumentBytes)
	if err != nil {
		size := l.size
		if size < 0 && len(data) <= o.MaxDocumentBytes {
			size = int64(len(data))
		}
		return unreadableDocument(l, size, data[:min(len(data), unreadableHeadBytes)], err, listedAt), &Skipped{Key: l.key, Err: err}, true, nil
	}
	d = Document{Key: l.key, Failure: f, Modified: l.modified, At: f.Time, AtSource: TimeFromDocument}
	switch {
	case !f.Time.IsZero() && kferrors.UsableTime(l.modified) && f.Time.After(l.modified.Add(ModifiedResolution)):
		d.At, d.AtSource = l.modified.UTC(), TimeFromModifiedClamped
	case !f.Time.IsZero():
	case kferrors.UsableTime(l.modified):
		// A modification time can be anything too (touch -d @0): only a
		// usable one stands in, else the listing time.
		d.At, d.AtSource = l.modified.UTC(), TimeFromModified
	default:
		d.At, d.AtSource = listedAt, TimeFromListing
	}
	return d, nil, true, nil
}

// ModifiedResolution is how much later than a store's modification time
// a document may say it was written and still be believed: S3 keeps
// Last-Modified to the whole second, and a file system's timestamps come
// from a coarse clock a few milliseconds behind the real one. Only a
// document dated past its write time by more than this (a pod whose clock
// runs ahead) is clamped to it; clamping any later one would date every
// document on S3 to its whole second, and tie the failures of a second
// again (issue 27).
const ModifiedResolution = time.Second
