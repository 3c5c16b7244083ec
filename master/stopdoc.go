package master

import (
	"context"
	"errors"
	"fmt"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// stopDocumentTimeout bounds the write of the master's own document.
const stopDocumentTimeout = 30 * time.Second

// writeStopDocument writes the master's error document for a stopped job
// (Options.ExitWhenDone) under EventsURL and returns its key; "" when the
// master has no error prefix. The pods' documents, written before they
// left, are earlier and decide the root cause; this one makes sure the
// job's failure is seen when no pod wrote any, or when every pod exited 0.
//
// The key is the stop decision's: a restarted master that writes it again
// finds it there (ErrExists), and the job has one such document.
func (s *Server) writeStopDocument(ctx context.Context, d Decision) (string, error) {
	if s.opts.EventsURL == "" {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, stopDocumentTimeout)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, s.opts.EventsURL, true)
	if err != nil {
		return "", fmt.Errorf("the master's stop document: %w", err)
	}
	defer b.Close()
	f := StopFailure(d, s.opts.Pod)
	w := kferrors.NewWriter(b, nil)
	_, data, err := w.Prepare(f)
	if err != nil {
		return "", fmt.Errorf("the master's stop document: %w", err)
	}
	key := kferrors.NewKey(f.Time, f.Worker, fmt.Sprintf("%016x", d.Seq))
	if err := w.Put(ctx, key, data); err != nil && !errors.Is(err, kferrors.ErrExists) {
		return "", fmt.Errorf("the master's stop document: %w", err)
	}
	return key, nil
}

// StopFailure is the failure a stopped job's master documents: JobStopped,
// at the stop, with its reason; recoverable and the system's, as a
// Kubeflow job that failed without a pod's word (a retry of the task may
// find the nodes it lacked).
func StopFailure(d Decision, pod string) kferrors.Failure {
	if pod == "" {
		pod = "master"
	}
	return kferrors.SystemFailure(kferrors.CodeJobStopped, "the master stopped the job: "+d.Message, pod, d.Time)
}
