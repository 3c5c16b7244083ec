package errors

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

// SupersededPrefix is where documents of failures that were recovered from
// are kept. Readers list only error*.pb directly under the output prefix
// (ours and upstream's alike), so a document moved here no longer decides a
// task's outcome, yet nothing is lost.
const SupersededPrefix = "superseded/"

// Supersede moves the documents of pod — worker pod or "<pod>/<local rank>"
// — dated before `before` to superseded/<key>, and returns the keys moved.
//
// The agent calls it whenever it starts a group: a group that starts is the
// recovery of every earlier failure of its pod (a worker restarted in place,
// or, since the training operator recreates a pod under the same name, the
// previous incarnation of a preempted or OOM-killed pod). Without it a job
// that recovered and then succeeded would still be reported failed, and a
// recovered early failure would win "earliest" over the real root cause.
//
// The copy is written (IfNotExist) before the original is deleted, so a
// crash in between leaves two copies, never none. Documents it cannot read
// or decode are left in place for the reader to report.
func Supersede(ctx context.Context, b *blob.Bucket, pod string, before time.Time) ([]string, error) {
	if pod == "" {
		return nil, nil
	}
	return SupersedePods(ctx, b, []string{pod}, before)
}

// SupersedePods is Supersede for several pods with one listing: the
// master's, for the pods a job went on without (a departed rank whose
// replacement never trained, a scale-down).
func SupersedePods(ctx context.Context, b *blob.Bucket, pods []string, before time.Time) ([]string, error) {
	keyWorkers := make([]string, 0, len(pods))
	for _, pod := range pods {
		if pod != "" {
			keyWorkers = append(keyWorkers, SanitizeWorker(pod))
		}
	}
	if len(keyWorkers) == 0 {
		return nil, nil
	}
	var candidates []string
	var page []*blob.ListObject
	for token := blob.FirstPageToken; len(page) > 0 || token != nil; {
		if len(page) == 0 {
			var err error
			if page, token, err = ListPage(ctx, b, token, 1000, &blob.ListOptions{Prefix: KeyPrefix, Delimiter: "/"}); err != nil {
				return nil, fmt.Errorf("list error documents: %w", err)
			}
			continue
		}
		obj := page[0]
		page = page[1:]
		if obj.IsDir || !IsDocumentKey(obj.Key) || Irregular(obj) != "" {
			continue // a link or a FIFO is no document to move: left for the reader to report
		}
		// Our own names carry time and sanitized worker: skip the
		// documents that cannot match without reading them.
		if t, ok := TimeFromKey(obj.Key); ok {
			if !t.Before(before) || !slices.ContainsFunc(keyWorkers, func(w string) bool { return keyNamesWorkerOf(obj.Key, w) }) {
				continue
			}
		}
		candidates = append(candidates, obj.Key)
	}
	var moved []string
	for _, key := range candidates {
		data, err := ReadDocument(ctx, b, key, DefaultMaxDocumentBytes)
		if err != nil {
			continue // vanished, unreadable, oversized: left for the reader
		}
		f, err := DecodeFailure(data, DefaultMaxDocumentBytes)
		if err != nil || !slices.ContainsFunc(pods, func(pod string) bool { return pod != "" && ofPod(f.Worker, pod) }) ||
			f.Time.IsZero() || !f.Time.Before(before) {
			continue
		}
		if err := MoveDocument(ctx, b, key, data, SupersededPrefix); err != nil {
			return moved, err
		}
		moved = append(moved, key)
	}
	return moved, nil
}

// ofPod reports whether worker is pod itself or one of its workers.
func ofPod(worker, pod string) bool {
	return worker == pod || strings.HasPrefix(worker, pod+"/")
}

// keyNamesWorkerOf reports whether one of our keys may name a worker of the
// pod whose sanitized name is keyWorker (a candidate filter: the document's
// own worker decides). "<pod>/<rank>" is sanitized to "<pod>.<rank>", cut at
// 64 bytes like the pod's own name, so a long pod still matches itself.
func keyNamesWorkerOf(key, keyWorker string) bool {
	w := WorkerFromKey(key)
	return w == keyWorker || strings.HasPrefix(w, keyWorker+".")
}

// RefinedPrefix is where a document is kept that the agent rewrote with a
// more precise time under our own name (flytekit's, dated to torch's whole
// second): out of the reader's way, and not a recovered failure either.
const RefinedPrefix = "refined/"

// MoveDocument moves the document at key, whose bytes are data, to
// prefix+key: the copy is written (IfNotExist) before the original is
// deleted, so a crash in between leaves two copies, never none.
func MoveDocument(ctx context.Context, b *blob.Bucket, key string, data []byte, prefix string) error {
	err := b.WriteAll(ctx, prefix+key, data, &blob.WriterOptions{ContentType: "application/octet-stream", IfNotExist: true})
	if err != nil && gcerrors.Code(err) != gcerrors.FailedPrecondition {
		return fmt.Errorf("keep document %s under %s: %w", key, prefix, err)
	}
	if err := b.Delete(ctx, key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		return fmt.Errorf("remove document %s: %w", key, err)
	}
	return nil
}
