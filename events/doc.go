// Package events is the pods' event log: what happened in a pod besides its
// failure (a group of workers started, a worker exited, the group restarted,
// the pod failed or succeeded, the master relaunched it), kept next to the
// error documents so that the failure report (package report) can draw
// restarts and relaunches in each pod's lane.
//
// The log is append-only: each event is one small object, written once with
// IfNotExist and never changed, so writers (every pod's agent, the master)
// need no coordination and a crash loses at most the events not yet written.
//
//	w := events.NewWriter(bucket)            // bucket from errors.OpenPrefix(url)
//	key, err := w.Append(ctx, events.Event{Time: now, Pod: pod, Kind: events.GroupStarted, Attempt: 1})
//	log, err := events.Read(ctx, bucket, nil) // every event in time order, bad ones in log.Skipped
//
// # Format, version 1
//
// Place: <output prefix>/events/<19-digit UTC ns>-<pod>-<16 hex>.json, the
// pod sanitized as error document names are (errors.SanitizeWorker). A
// listing orders events by time as it does our error documents; the event's
// own time still decides. The folder keeps events out of every error
// reader's way: upstream propeller lists "<prefix>/error…", our readers list
// error*.pb directly under the prefix.
//
// Body: one JSON object in UTF-8, at most MaxBytes:
//
//	{"v":1,"time":"2026-11-21T10:00:01.123456789Z","pod":"job-worker-1","kind":"restart",
//	 "attempt":2,"restartCount":1,"reason":"failure"}
//
//	v             format version, 1; required
//	time          RFC 3339 with nanoseconds, from 2000 on (errors.UsableTime:
//	              never 1970); required
//	pod           the pod the event is about; required
//	kind          group-started | worker-exited | restart | relaunch |
//	              pod-failed | pod-succeeded; required
//	attempt       the group start this event belongs to (1, 2, …)
//	restartCount  TORCHELASTIC_RESTART_COUNT of that group
//	round         the rendezvous round
//	worldSize     the group's world size (workers in the round)
//	worker        "<pod>/<local rank>" (worker-exited)
//	exitCode      the process's exit status (worker-exited, pod-failed)
//	signal        the signal that ended it, e.g. "SIGKILL" (worker-exited)
//	code          the failure's code, as in the error document
//	stopped       the worker ended while the agent stopped its group
//	reason        why: "failure" or "membership" (restart); the master's
//	              reason (relaunch)
//	replacement   the new pod (relaunch)
//	document      the error document's key (pod-failed)
//	message       a short text, at most MaxMessageBytes
//
// Readers ignore fields they do not know and keep events of kinds they do
// not know (shown as plain marks), so fields and kinds can be added within
// version 1. Anything else changes v; a reader skips (and counts) events of
// a version newer than it knows, as it does unreadable ones. On a file://
// prefix, links and special files under events/ are skipped, never followed
// or opened, as the error readers skip them.
package events
