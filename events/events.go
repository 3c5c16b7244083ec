package events

import (
	"context"
	"encoding/json"
	goerrors "errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
	"golang.org/x/sync/errgroup"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// Version is the format version this package writes and reads.
const Version = 1

// Limits of one event. Writers cap the message; readers refuse larger objects.
const (
	MaxBytes        = 16 << 10
	MaxMessageBytes = 1 << 10
)

// Prefix is the folder of the events under the output prefix.
const Prefix = "events/"

const keySuffix = ".json"

// Kind says what happened.
type Kind string

// The kinds of version 1.
const (
	// GroupStarted: the agent started a group of workers (attempt,
	// restartCount, round, worldSize).
	GroupStarted Kind = "group-started"
	// WorkerExited: one worker process ended (worker, exitCode or signal,
	// code when it failed, stopped when the agent was stopping the group).
	WorkerExited Kind = "worker-exited"
	// Restart: the agent restarts the group in place (attempt of the next
	// group, restartCount after it, reason "failure" or "membership").
	Restart Kind = "restart"
	// Relaunch: the pod is replaced by a new one (replacement, reason);
	// written by whoever owns pods (the master, the local engine).
	Relaunch Kind = "relaunch"
	// PodFailed: the agent gave up (code, exitCode, document).
	PodFailed Kind = "pod-failed"
	// PodSucceeded: every worker of the pod succeeded.
	PodSucceeded Kind = "pod-succeeded"
)

// Known reports whether k is a kind of version 1.
func (k Kind) Known() bool {
	switch k {
	case GroupStarted, WorkerExited, Restart, Relaunch, PodFailed, PodSucceeded:
		return true
	}
	return false
}

// Event is one entry of the log. See the package documentation for the
// meaning of each field; zero values are left out of the JSON.
type Event struct {
	Version      int       `json:"v"`
	Time         time.Time `json:"time"`
	Pod          string    `json:"pod"`
	Kind         Kind      `json:"kind"`
	Attempt      int       `json:"attempt,omitempty"`
	RestartCount int       `json:"restartCount,omitempty"`
	Round        int       `json:"round,omitempty"`
	WorldSize    int       `json:"worldSize,omitempty"`
	Worker       string    `json:"worker,omitempty"`
	ExitCode     *int      `json:"exitCode,omitempty"`
	Signal       string    `json:"signal,omitempty"`
	Code         string    `json:"code,omitempty"`
	Stopped      bool      `json:"stopped,omitempty"`
	Reason       string    `json:"reason,omitempty"`
	Replacement  string    `json:"replacement,omitempty"`
	Document     string    `json:"document,omitempty"`
	Message      string    `json:"message,omitempty"`

	// Key is the object the event was read from; not part of the body.
	Key string `json:"-"`
}

// Reasons an event object is unusable; Read skips such objects and says why.
var (
	ErrEmpty    = goerrors.New("empty event")
	ErrTooLarge = goerrors.New("event too large")
	ErrCorrupt  = goerrors.New("corrupt event")
	// ErrNewerVersion: written in a format version this reader does not know.
	ErrNewerVersion = goerrors.New("event of a newer format version")
	// ErrUnreadable: an entry no one should read as an event (a symbolic
	// link, never followed; a FIFO or other special file) or may not (no
	// permission), as the error readers skip them (errors.Irregular).
	ErrUnreadable = goerrors.New("unreadable event")
)

// Encode serializes ev in the current version: it sets v, caps the message,
// makes strings valid UTF-8 and the time UTC, and refuses an event without
// a usable time (errors.UsableTime: never 1970), pod or kind.
func Encode(ev Event) ([]byte, error) {
	ev.Version = Version
	ev.Time = ev.Time.UTC()
	ev.Message = kferrors.CapMessage(ev.Message, MaxMessageBytes)
	if err := ev.validate(); err != nil {
		return nil, err
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), MaxBytes)
	}
	return data, nil
}

// Decode parses one stored event. It rejects what is not one JSON object of
// a known version with a usable time, pod and kind; it keeps unknown kinds
// and ignores unknown fields (both may be added within a version).
func Decode(data []byte) (Event, error) {
	switch {
	case len(data) == 0:
		return Event{}, ErrEmpty
	case len(data) > MaxBytes:
		return Event{}, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), MaxBytes)
	}
	// The version first, so that a newer writer's changed fields give the
	// version error, not a confusing type error.
	var head struct {
		Version json.RawMessage `json:"v"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	v, err := strconv.Atoi(string(head.Version))
	switch {
	case len(head.Version) == 0:
		return Event{}, fmt.Errorf("%w: no version (\"v\")", ErrCorrupt)
	case err != nil || v < 1:
		return Event{}, fmt.Errorf("%w: version %s", ErrCorrupt, head.Version)
	case v > Version:
		return Event{}, fmt.Errorf("%w: version %d, this reader knows %d", ErrNewerVersion, v, Version)
	}
	var ev Event
	if err := json.Unmarshal(data, &ev); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	ev.Time = ev.Time.UTC()
	if err := ev.validate(); err != nil {
		return Event{}, err
	}
	return ev, nil
}

func (ev *Event) validate() error {
	switch {
	case ev.Time.IsZero():
		return fmt.Errorf("%w: no time", ErrCorrupt)
	case !kferrors.UsableTime(ev.Time):
		return fmt.Errorf("%w: time %s is not usable (before 2000 or out of range)", ErrCorrupt, ev.Time.Format(time.RFC3339Nano))
	case ev.Pod == "":
		return fmt.Errorf("%w: no pod", ErrCorrupt)
	case ev.Kind == "":
		return fmt.Errorf("%w: no kind", ErrCorrupt)
	}
	return nil
}

// NewKey names an event of pod at t: events/<19-digit ns>-<pod>-<random>.json.
func NewKey(t time.Time, pod, random string) string {
	var ns int64
	if kferrors.UsableTime(t) {
		ns = t.UnixNano()
	}
	return fmt.Sprintf("%s%019d-%s-%s%s", Prefix, ns, kferrors.SanitizeWorker(pod), random, keySuffix)
}

// Writer appends events under an output prefix.
type Writer struct{ bucket *blob.Bucket }

// NewWriter writes into bucket (see errors.OpenPrefix). It does not own it.
func NewWriter(bucket *blob.Bucket) *Writer { return &Writer{bucket: bucket} }

// Append stores ev under a new key and returns the key; it never replaces
// an object (errors.WriteNew).
func (w *Writer) Append(ctx context.Context, ev Event) (string, error) {
	data, err := Encode(ev)
	if err != nil {
		return "", err
	}
	key, err := kferrors.WriteNew(ctx, w.bucket, data, "application/json", func() string {
		return NewKey(ev.Time, ev.Pod, kferrors.RandomSuffix())
	})
	if err != nil {
		return "", fmt.Errorf("write event %s: %w", key, err)
	}
	return key, nil
}

// Skipped is an object under events/ that Read could not use, and why.
type Skipped struct {
	Key string
	Err error
}

// Log is what Read found: the events in order (time, pod, key) and the
// objects it skipped, by key.
type Log struct {
	Events  []Event
	Skipped []Skipped
}

// ReadOptions tunes Read; nil means defaults.
type ReadOptions struct {
	// Concurrency bounds concurrent reads; default 32.
	Concurrency int
	// CallTimeout bounds each call to the store (a listing page, one
	// event's read); 0: no bound. The bucket must honour its context
	// (gocloud.dev's do).
	CallTimeout time.Duration
}

// listPageSize is how many keys one listing call returns.
const listPageSize = 1000

// Read lists and reads every event under bucket's events/ folder. An
// unusable object (not *.json, empty, too large, corrupt, of a newer
// version, vanished, unreadable: a link, a special file, no permission) is
// skipped and reported, never followed or opened; an error of the store
// itself (a listing or read that fails, no answer within CallTimeout)
// fails the read.
func Read(ctx context.Context, bucket *blob.Bucket, opts *ReadOptions) (*Log, error) {
	conc := 32
	var callTimeout time.Duration
	if opts != nil {
		if opts.Concurrency > 0 {
			conc = opts.Concurrency
		}
		callTimeout = opts.CallTimeout
	}
	// within bounds one call by CallTimeout.
	within := func(ctx context.Context) (context.Context, context.CancelFunc) {
		if callTimeout <= 0 {
			return ctx, func() {}
		}
		return context.WithTimeout(ctx, callTimeout)
	}
	log := &Log{}
	var mu sync.Mutex
	skip := func(key string, err error) {
		mu.Lock()
		defer mu.Unlock()
		log.Skipped = append(log.Skipped, Skipped{Key: key, Err: err})
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	// By pages, each listed again if an entry vanished during its walk (a
	// writer's temporary file renamed into place: kferrors.ListPage).
	var page []*blob.ListObject
	for token := blob.FirstPageToken; ; {
		if len(page) == 0 {
			if token == nil {
				break
			}
			lctx, cancel := within(gctx)
			var err error
			page, token, err = kferrors.ListPage(lctx, bucket, token, listPageSize, &blob.ListOptions{Prefix: Prefix})
			cancel()
			if err != nil {
				if werr := g.Wait(); werr != nil {
					return nil, werr
				}
				return nil, fmt.Errorf("list events: %w", err)
			}
			continue
		}
		obj := page[0]
		page = page[1:]
		switch {
		case obj.IsDir, kferrors.IsPartialWrite(obj.Key):
			continue
		case kferrors.Irregular(obj) != "":
			skip(obj.Key, fmt.Errorf("%w: %s", ErrUnreadable, kferrors.Irregular(obj)))
			continue
		case !strings.HasSuffix(obj.Key, keySuffix):
			skip(obj.Key, fmt.Errorf("%w: not a %s object", ErrCorrupt, keySuffix))
			continue
		case obj.Size > MaxBytes:
			skip(obj.Key, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, obj.Size, MaxBytes))
			continue
		}
		g.Go(func() error {
			rctx, cancel := within(gctx)
			defer cancel()
			data, err := readAtMost(rctx, bucket, obj.Key, MaxBytes)
			if goerrors.Is(err, ErrUnreadable) {
				skip(obj.Key, err)
				return nil
			}
			if err != nil {
				return err
			}
			if data == nil {
				skip(obj.Key, fmt.Errorf("%w: vanished", ErrEmpty))
				return nil
			}
			ev, err := Decode(data)
			if err != nil {
				skip(obj.Key, err)
				return nil
			}
			ev.Key = obj.Key
			mu.Lock()
			log.Events = append(log.Events, ev)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	slices.SortFunc(log.Events, Compare)
	slices.SortFunc(log.Skipped, func(a, b Skipped) int { return strings.Compare(a.Key, b.Key) })
	return log, nil
}

// Compare orders events by time, then pod, then key.
func Compare(a, b Event) int {
	if c := a.Time.Compare(b.Time); c != 0 {
		return c
	}
	if c := strings.Compare(a.Pod, b.Pod); c != 0 {
		return c
	}
	return strings.Compare(a.Key, b.Key)
}

// readAtMost reads up to max+1 bytes of key; nil, nil when it vanished. An
// error about this entry alone (access denied, the file system's refusal of
// this file) wraps ErrUnreadable; any other is the store's own.
func readAtMost(ctx context.Context, b *blob.Bucket, key string, max int) ([]byte, error) {
	r, err := b.NewReader(ctx, key, nil)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, nil
	}
	if err != nil {
		return nil, readError(key, err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
	if err != nil {
		return nil, readError(key, err)
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

func readError(key string, err error) error {
	if kferrors.EntryError(err) {
		return fmt.Errorf("read event %s: %w: %v", key, ErrUnreadable, err)
	}
	return fmt.Errorf("read event %s: %w", key, err)
}
