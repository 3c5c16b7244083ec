package agent

import (
	"context"
	"log/slog"
	"time"

	"gocloud.dev/blob"

	kferrors "github.com/kfelastic/kfelastic/errors"
	podevents "github.com/kfelastic/kfelastic/events"
)

// eventQueue is how many events may wait for storage; beyond it new ones
// are dropped (and logged) rather than hold up the supervisor.
const eventQueue = 256

// Budgets of the event writes: one write, and the drain at exit (the pod
// may be on its way out under a SIGTERM grace). Both are cut to
// --storage-timeout when it is shorter, so that a store that never answers
// costs the agent's exit no more than it does for the document.
const (
	eventWriteTimeout = 10 * time.Second
	eventDrainTimeout = 5 * time.Second
)

// eventLog appends the pod's events (package events: group started, worker
// exited, restart, pod failed or succeeded) next to its error documents, for
// the failure report. One goroutine writes them in order in the background,
// so that storage never delays a restart; a failed write is logged and the
// event dropped, never the pod failed. A nil *eventLog does nothing (no
// --error-prefix).
type eventLog struct {
	bucket *blob.Bucket
	w      *podevents.Writer
	log    *slog.Logger
	queue  chan podevents.Event
	done   chan struct{}
	// writeTimeout and drainTimeout are the budgets above, cut to the
	// storage timeout.
	writeTimeout, drainTimeout time.Duration
}

// openEventLog opens prefix for events; "" gives a nil log. storageTimeout
// (Config.StorageTimeout) caps each write and the drain at exit.
func openEventLog(ctx context.Context, prefix string, log *slog.Logger, storageTimeout time.Duration) (*eventLog, error) {
	if prefix == "" {
		return nil, nil
	}
	b, err := kferrors.OpenPrefix(ctx, prefix, true)
	if err != nil {
		return nil, err
	}
	e := &eventLog{bucket: b, w: podevents.NewWriter(b), log: log, queue: make(chan podevents.Event, eventQueue), done: make(chan struct{}),
		writeTimeout: min(eventWriteTimeout, storageTimeout), drainTimeout: min(eventDrainTimeout, storageTimeout)}
	go e.run(context.WithoutCancel(ctx))
	return e, nil
}

func (e *eventLog) run(ctx context.Context) {
	defer close(e.done)
	for ev := range e.queue {
		wctx, cancel := context.WithTimeout(ctx, e.writeTimeout)
		if _, err := e.w.Append(wctx, ev); err != nil {
			e.log.Warn("cannot write event", "kind", ev.Kind, "err", err)
		}
		cancel()
	}
}

// append queues ev without blocking.
func (e *eventLog) append(ev podevents.Event) {
	if e == nil {
		return
	}
	select {
	case e.queue <- ev:
	default:
		e.log.Warn("event dropped: storage is behind", "kind", ev.Kind, "queued", eventQueue)
	}
}

// close writes what is queued, for at most drainTimeout, and closes
// the bucket. It is called once, after the last append.
func (e *eventLog) close() {
	if e == nil {
		return
	}
	close(e.queue)
	select {
	case <-e.done:
		e.bucket.Close()
	case <-time.After(e.drainTimeout):
		e.log.Warn("events not written before exit", "left", len(e.queue))
	}
}
