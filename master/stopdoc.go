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
	key, err := s.writeOwnDocument(ctx, StopFailure(d, s.opts.Pod), fmt.Sprintf("%016x", d.Seq))
	if err != nil {
		return "", fmt.Errorf("the master's stop document: %w", err)
	}
	return key, nil
}

// writeOwnDocument writes a failure the master established (a stopped
// job, a pod's hardware fault) under EventsURL, named with suffix (16
// characters a caller derives from what the failure is about, so that
// writing it again, after a restart or a repeated event, finds it there);
// "" when the master has no error prefix.
func (s *Server) writeOwnDocument(ctx context.Context, f kferrors.Failure, suffix string) (string, error) {
	if s.opts.EventsURL == "" {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, stopDocumentTimeout)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, s.opts.EventsURL, true)
	if err != nil {
		return "", err
	}
	defer b.Close()
	w := kferrors.NewWriter(b, nil)
	_, data, err := w.Prepare(f)
	if err != nil {
		return "", err
	}
	key := kferrors.DocumentKey(f, suffix)
	if err := w.Put(ctx, key, data); err != nil && !errors.Is(err, kferrors.ErrExists) {
		return "", err
	}
	return key, nil
}

// HardwareFault takes a live pod out for a fault of its device that a node
// daemon reported (master/kube's GPU fault events): the master writes the
// pod's document (f, named after id, the event) and then treats the pod as
// gone with f (PodGone): its rank is relaunched as the policy says for
// f's code (a hardware code: on another node, not counted), its agent is
// told to exit at its next call. The document is written first, so that
// the pod's own, later and secondary failure never stands alone.
func (s *Server) HardwareFault(ctx context.Context, pod string, f kferrors.Failure, id string) error {
	key, err := s.writeOwnDocument(ctx, f, id)
	if err != nil {
		s.log.Warn("cannot write a hardware fault's document; the pod is taken out all the same", "pod", pod, "err", err)
	} else {
		s.log.Warn("hardware fault: the pod is taken out", "pod", pod, "code", f.Code, "document", key, "message", f.Message)
	}
	return s.PodGone(ctx, pod, f)
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
