package events

import (
	"context"
	"log/slog"
	"time"

	"gocloud.dev/blob"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// AppenderQueue is how many events may wait for storage; beyond it new ones
// are dropped (and logged) rather than hold up the writer's owner.
const AppenderQueue = 256

// Appender appends events in the background, in order, for a supervisor
// (the agent, the master) that must never wait on storage: a failed write
// is logged and the event dropped, never the caller failed. A nil
// *Appender does nothing (no prefix).
type Appender struct {
	bucket *blob.Bucket
	w      *Writer
	log    *slog.Logger
	queue  chan Event
	done   chan struct{}
	// writeTimeout bounds one write; drainTimeout the writes left at Close
	// (the process may be on its way out under a SIGTERM grace).
	writeTimeout, drainTimeout time.Duration
}

// OpenAppender opens prefix (a URL, as errors.OpenPrefix takes) for
// events; "" gives a nil Appender.
func OpenAppender(ctx context.Context, prefix string, log *slog.Logger, writeTimeout, drainTimeout time.Duration) (*Appender, error) {
	if prefix == "" {
		return nil, nil
	}
	b, err := kferrors.OpenPrefix(ctx, prefix, true)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	a := &Appender{bucket: b, w: NewWriter(b), log: log, queue: make(chan Event, AppenderQueue), done: make(chan struct{}),
		writeTimeout: writeTimeout, drainTimeout: drainTimeout}
	go a.run(context.WithoutCancel(ctx))
	return a, nil
}

func (a *Appender) run(ctx context.Context) {
	defer close(a.done)
	for ev := range a.queue {
		wctx, cancel := context.WithTimeout(ctx, a.writeTimeout)
		if _, err := a.w.Append(wctx, ev); err != nil {
			a.log.Warn("cannot write event", "kind", ev.Kind, "err", err)
		}
		cancel()
	}
}

// Append queues ev without blocking.
func (a *Appender) Append(ev Event) {
	if a == nil {
		return
	}
	select {
	case a.queue <- ev:
	default:
		a.log.Warn("event dropped: storage is behind", "kind", ev.Kind, "queued", AppenderQueue)
	}
}

// Close writes what is queued, for at most the drain timeout, and closes
// the bucket. It is called once, after the last Append.
func (a *Appender) Close() {
	if a == nil {
		return
	}
	close(a.queue)
	select {
	case <-a.done:
		a.bucket.Close()
	case <-time.After(a.drainTimeout):
		a.log.Warn("events not written before exit", "left", len(a.queue))
	}
}
