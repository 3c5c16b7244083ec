package agent

import (
	"context"
	"log/slog"
	"time"

	podevents "github.com/kfelastic/kfelastic/events"
)

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
// the failure report, in the background (events.Appender): storage never
// delays a restart. A nil *eventLog does nothing (no --error-prefix).
type eventLog struct{ a *podevents.Appender }

// openEventLog opens prefix for events; "" gives a nil log. storageTimeout
// (Config.StorageTimeout) caps each write and the drain at exit.
func openEventLog(ctx context.Context, prefix string, log *slog.Logger, storageTimeout time.Duration) (*eventLog, error) {
	a, err := podevents.OpenAppender(ctx, prefix, log, min(eventWriteTimeout, storageTimeout), min(eventDrainTimeout, storageTimeout))
	if a == nil || err != nil {
		return nil, err
	}
	return &eventLog{a: a}, nil
}

// append queues ev without blocking.
func (e *eventLog) append(ev podevents.Event) {
	if e != nil {
		e.a.Append(ev)
	}
}

// close writes what is queued, for at most the drain timeout.
func (e *eventLog) close() {
	if e != nil {
		e.a.Close()
	}
}
