package agent

import (
	"context"
	goerrors "errors"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gocloud.dev/blob"

	"github.com/kfelastic/kfelastic/agent/refine"
	kferrors "github.com/kfelastic/kfelastic/errors"
)

// DefaultStorageTimeout is Config.StorageTimeout's default.
const DefaultStorageTimeout = 30 * time.Second

// write keeps the pod's error document and returns where it is: its key
// under ErrorPrefix once uploaded, else the path of the local copy.
//
// The document is written first to the run's log folder, a local file that
// needs no network, so that it exists whatever storage does. It is then
// uploaded under ErrorPrefix with the same key and bytes, attempt after
// attempt (each at most a third of StorageTimeout, 10 s at most) until
// StorageTimeout has passed: an endpoint that accepts and never answers
// costs one attempt, not the document, and storage that comes back within
// the timeout gets it. Retrying the same key is safe: the write is
// conditional, and finding the key taken means an earlier attempt landed.
// Without a prefix the document is only logged and kept locally.
func (l *loop) write(f kferrors.Failure) string {
	l.log.Info("pod error document", "code", f.Code, "worker", f.Worker, "time", f.Time, "recoverable", f.Recoverable,
		"message", kferrors.OneLine(f.Message))
	key, data, err := kferrors.NewWriter(nil, nil).Prepare(f)
	if err != nil {
		l.log.Error("cannot encode error document", "err", err)
		return ""
	}
	local := filepath.Join(l.runDir, key)
	if err := os.WriteFile(local, data, 0o644); err != nil {
		l.log.Error("cannot keep error document locally", "path", local, "err", err)
		local = ""
	}
	if l.cfg.ErrorPrefix == "" {
		return local
	}
	deadline := time.Now().Add(l.cfg.StorageTimeout)
	attemptTimeout := min(10*time.Second, max(l.cfg.StorageTimeout/3, 500*time.Millisecond))
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(l.work, min(attemptTimeout, time.Until(deadline)))
		uploaded, own, err := l.upload(ctx, f, key, data)
		cancel()
		if err == nil && own != nil && l.cfg.command() {
			// The refinement gets the rest of StorageTimeout, and never
			// less than an attempt: it reads, rewrites and moves a
			// document that may be megabytes (a tensor printed whole in
			// its message), and under load that outlasted the attempt
			// that found it, leaving flytekit's oversized document to
			// stand for the pod (CI, 2026-12-06).
			refineBy := deadline
			if least := time.Now().Add(attemptTimeout); least.After(refineBy) {
				refineBy = least
			}
			uploaded = l.refineOwn(refineBy, uploaded, own)
		}
		if err == nil {
			return uploaded
		}
		wait := min(backoff, time.Until(deadline))
		if wait <= 0 {
			l.log.Error("cannot upload error document; it is kept locally", "prefix", l.cfg.ErrorPrefix, "attempts", attempt,
				"path", local, "err", err)
			return local
		}
		l.log.Warn("error document not uploaded yet; retrying", "prefix", l.cfg.ErrorPrefix, "attempt", attempt,
			"retry_in", wait, "err", err)
		time.Sleep(wait)
		backoff = min(2*backoff, 5*time.Second)
	}
}

// upload stores the prepared document under ErrorPrefix, unless the failed
// worker wrote its own there (flytekit with _F_DES set): then that one's
// key and bytes (own) are returned and ours is not stored.
func (l *loop) upload(ctx context.Context, f kferrors.Failure, key string, data []byte) (_ string, own []byte, _ error) {
	b, err := kferrors.OpenPrefix(ctx, l.cfg.ErrorPrefix, true)
	if err != nil {
		return "", nil, err
	}
	defer b.Close()
	worker, since := f.Worker, l.groupStarted
	if l.cfg.command() {
		// flytekit names the pod (_F_WN as given), not "<pod>/0", and
		// dates its document to torch's whole second.
		worker, since = l.cfg.Pod, since.Truncate(time.Second)
	}
	if ownKey, ownData, ok := workerDocument(ctx, b, worker, since); ok {
		l.log.Info("worker wrote its own error document", "prefix", l.cfg.ErrorPrefix, "key", ownKey, "worker", f.Worker)
		return ownKey, ownData, nil
	}
	err = kferrors.NewWriter(b, nil).Put(ctx, key, data)
	if goerrors.Is(err, kferrors.ErrExists) {
		// An attempt whose answer was lost stored it after all.
		err = nil
	}
	if err != nil {
		return "", nil, err
	}
	l.log.Info("error document written", "prefix", l.cfg.ErrorPrefix, "key", key)
	return key, nil, nil
}

// refineOwn refines the document the command wrote itself (key, its bytes
// data), however the pod ends (the command failed, the master's EXIT, a
// preemption, a hang), before it stands for the pod, and returns the key
// that stands: the refined one, else key.
func (l *loop) refineOwn(deadline time.Time, key string, data []byte) string {
	ctx, cancel := context.WithDeadline(l.work, deadline)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, l.cfg.ErrorPrefix, true)
	if err != nil {
		l.log.Error("cannot open error prefix", "prefix", l.cfg.ErrorPrefix, "err", err)
		return key
	}
	defer b.Close()
	if cf, refined, ok := l.refineFound(ctx, b, key, data); ok {
		l.commandDoc, key = &cf, refined
	}
	return key
}

// supersede moves this pod's documents dated before a group start out of the
// reader's way (kferrors.Supersede): the start is their recovery. It runs
// beside the group so that a restart is not delayed by storage; it touches
// only documents dated before the start, the write path only later ones. It
// gets StorageTimeout, which also bounds how long the agent's exit waits
// for it.
func (l *loop) supersede(start time.Time) {
	if l.cfg.ErrorPrefix == "" {
		return
	}
	l.superseding.Add(1)
	go func() {
		defer l.superseding.Done()
		ctx, cancel := context.WithTimeout(l.work, l.cfg.StorageTimeout)
		defer cancel()
		b, err := kferrors.OpenPrefix(ctx, l.cfg.ErrorPrefix, true)
		if err != nil {
			l.log.Error("cannot open error prefix", "prefix", l.cfg.ErrorPrefix, "err", err)
			return
		}
		defer b.Close()
		moved, err := kferrors.Supersede(ctx, b, l.cfg.Pod, start)
		if err != nil {
			l.log.Error("cannot supersede recovered error documents", "prefix", l.cfg.ErrorPrefix, "err", err)
		}
		if len(moved) > 0 {
			l.log.Info("recovered error documents superseded", "count", len(moved), "to", kferrors.SupersededPrefix,
				"keys", moved)
		}
	}()
}

// workerDocument finds a document the failed worker wrote itself (flytekit
// with _F_DES set writes error-<uuid hex>.pb naming _F_WN as its worker):
// then the agent writes none (docs/DESIGN.md §2.3). Our own keys carry a time and
// are skipped unread; at most 64 others are read. Only a document from the
// last attempt (timed at or after since) counts: worker names repeat across
// attempts.
func workerDocument(ctx context.Context, b *blob.Bucket, worker string, since time.Time) (key string, data []byte, ok bool) {
	if worker == "" {
		return "", nil, false
	}
	it := b.List(&blob.ListOptions{Prefix: kferrors.KeyPrefix})
	for read := 0; read < 64; {
		obj, err := it.Next(ctx)
		if err != nil {
			return "", nil, false
		}
		if !kferrors.IsDocumentKey(obj.Key) || kferrors.Irregular(obj) != "" {
			continue
		}
		if _, ours := kferrors.TimeFromKey(obj.Key); ours {
			continue
		}
		read++
		data, err := kferrors.ReadDocument(ctx, b, obj.Key, maxCommandDocumentBytes)
		if err != nil {
			continue
		}
		if f, err := kferrors.DecodeFailure(data, maxCommandDocumentBytes); err == nil && f.Worker == worker && !f.Time.Before(since) {
			return obj.Key, data, true
		}
	}
	return "", nil, false
}

// refineCommandDocument finds the document the command wrote itself for
// this pod in this attempt and refines it (refineFound). The document
// found (refined or not) is returned; ok is false when the command wrote
// none in this attempt.
func (l *loop) refineCommandDocument() (f kferrors.Failure, key string, ok bool) {
	if l.cfg.ErrorPrefix == "" || l.cfg.Pod == "" {
		return f, "", false
	}
	ctx, cancel := context.WithTimeout(l.work, l.cfg.StorageTimeout)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, l.cfg.ErrorPrefix, true)
	if err != nil {
		l.log.Error("cannot open error prefix", "prefix", l.cfg.ErrorPrefix, "err", err)
		return f, "", false
	}
	defer b.Close()
	// flytekit's time is a whole second: one in the second the group
	// started in is of this attempt.
	key, data, ok := workerDocument(ctx, b, l.cfg.Pod, l.groupStarted.Truncate(time.Second))
	if !ok {
		return f, "", false
	}
	return l.refineFound(ctx, b, key, data)
}

// refineFound gives the document the command wrote itself for this pod
// (flytekit's pyflyte-execute, docs/DESIGN.md §4.4: error-<uuid hex>.pb,
// worker = the pod name, timestamp = torch's ProcessFailure.timestamp in
// whole seconds) the sub-second time and the real exception docs/DESIGN.md
// §3 wants, however the pod ends. Torch's whole second orders two pods
// that fail within one second by their names, so that the secondary
// "[gloo] Connection closed by peer" of one pod can win over the exception
// another pod raised; and within a pod torch names the lowest local rank
// of that second, not the one that raised. The pod's torch error files
// (refine.FromErrorFiles) say which rank failed first, when, and with what.
// The refined document is written under our own name (its time in the
// key) and flytekit's is moved to refined/ (kferrors.MoveDocument), so the
// reader sees one document per pod, the copy written before the original
// is moved. A document too large for the reader is rewritten so too, its
// message capped. data is the document's bytes when the caller has read
// them (nil: read here). The document (refined or not) is returned; ok is
// false when it cannot be read.
func (l *loop) refineFound(ctx context.Context, b *blob.Bucket, key string, data []byte) (f kferrors.Failure, _ string, ok bool) {
	var err error
	if data == nil {
		if data, err = kferrors.ReadDocument(ctx, b, key, maxCommandDocumentBytes); err != nil {
			return f, key, false
		}
	}
	if f, err = kferrors.DecodeFailure(data, maxCommandDocumentBytes); err != nil {
		return f, key, false
	}
	refined, how, rewrite := refine.CommandDocument(f, len(data), readErrorFiles(refine.RootCauseErrorFile(f.Message)))
	if !rewrite {
		l.log.Info("the command's error document stands as written", "key", key)
		return f, key, true
	}
	newKey, newData, err := kferrors.NewWriter(nil, nil).Prepare(refined)
	if err == nil {
		err = kferrors.NewWriter(b, nil).Put(ctx, newKey, newData)
	}
	if err != nil {
		l.log.Error("cannot write the refined error document; the command's stands", "key", key, "err", err)
		return f, key, true
	}
	if err := kferrors.MoveDocument(ctx, b, key, data, kferrors.RefinedPrefix); err != nil {
		l.log.Error("cannot move the command's error document aside", "key", key, "to", kferrors.RefinedPrefix, "err", err)
	}
	l.log.Info("the command's error document refined", "key", key, "refined", newKey, "time", refined.Time,
		"how", how, "bytes", len(data), "written_bytes", len(newData))
	return refined, newKey, true
}

// maxCommandDocumentBytes bounds what the agent reads of the command's own
// document: more than the reader takes (kferrors.DefaultMaxDocumentBytes),
// so that a long exception text is still this pod's failure, rewritten
// within the reader's limit, not a document nobody reads.
const maxCommandDocumentBytes = 32 << 20

// readErrorFiles reads the torch error files of every local rank of the
// attempt that named names one of: torch elastic writes
// <log dir>/<run>/attempt_<N>/<local rank>/error.json, and the root cause
// of flytekit's message names only the rank torch picked (the lowest in
// the earliest whole second). Files that are missing or unreadable are
// left out.
func readErrorFiles(named string) []refine.RankError {
	if named == "" {
		return nil
	}
	rankDir := filepath.Dir(named)
	paths, _ := filepath.Glob(filepath.Join(filepath.Dir(rankDir), "*", filepath.Base(named)))
	var out []refine.RankError
	for _, p := range paths {
		rank, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil || rank < 0 {
			continue
		}
		te, _, err := kferrors.ReadTorchError(p)
		if err != nil || te == nil {
			continue
		}
		out = append(out, refine.RankError{LocalRank: rank, Path: p, Err: te})
	}
	return out
}
