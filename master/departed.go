package master

import (
	"context"
	"fmt"
	"slices"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// A pod's failure stops deciding the task's outcome once something
// recovered from it: its documents move to superseded/ (kferrors.Supersede).
// Usually the pod's next agent does that when its group starts — on
// Kubernetes the training operator recreates a pod under its own name. A
// job that goes on without the pod has no such agent: the replacement of a
// node with a dead GPU may wait on another node for hours, or the job
// scales down. The master, which completed the round without the pod, moves
// its documents instead (Options.SupersedeDeparted): when such a round
// completes, the documents dated before it; when the job succeeds, all of
// them (a late upload included). Without it the plugin would read the
// success of a job that healed as the departed pod's failure, and retry it.

// departedPods are the pods the master decided about (a failure, a loss, a
// hardware fault) before `before` that are not members of round r: the job
// went on without them. In the loop.
func (s *Server) departedPods(r *Round, before time.Time) []string {
	if r == nil {
		return nil
	}
	members := make([]string, 0, len(r.Ranks))
	for _, rank := range r.Ranks {
		if n, ok := s.job.Node(rank); ok {
			members = append(members, n.Pod)
		}
	}
	var pods []string
	for _, d := range s.job.Decisions() {
		if d.Kind == StopJob || d.Pod == "" || !d.Time.Before(before) || slices.Contains(members, d.Pod) || slices.Contains(pods, d.Pod) {
			continue
		}
		pods = append(pods, d.Pod)
	}
	return pods
}

// supersedeAfterRound moves, beside the loop, the documents of the pods the
// latest round went on without, dated before it completed; only when this
// batch completed it.
func (s *Server) supersedeAfterRound(ctx context.Context, completed []int64) {
	l := s.job.Latest()
	if !s.opts.SupersedeDeparted || s.opts.EventsURL == "" || l == nil || !slices.Contains(completed, l.Number) {
		return
	}
	pods := s.departedPods(l, l.CompletedAt)
	if len(pods) == 0 {
		return
	}
	number, at := l.Number, l.CompletedAt
	s.superseding.Add(1)
	go func() {
		defer s.superseding.Done()
		if err := s.supersedeDeparted(ctx, pods, at, fmt.Sprintf("round %d went on without them", number)); err != nil {
			// The success pass tries again.
			s.log.Warn("cannot move the departed pods' documents aside", "round", number, "pods", pods, "err", err)
		}
	}()
}

// supersedeOnSuccess moves, before the master reports the job's success,
// every document of the pods the job succeeded without. An error leaves the
// job unfinished: a master restarted on the state tries again, as it does
// for its stop document.
func (s *Server) supersedeOnSuccess(ctx context.Context) error {
	s.superseding.Wait()
	if !s.opts.SupersedeDeparted || s.opts.EventsURL == "" {
		return nil
	}
	now := time.Now()
	pods := s.departedPods(s.job.Latest(), now)
	if len(pods) == 0 {
		return nil
	}
	return s.supersedeDeparted(ctx, pods, now, "the job succeeded without them")
}

func (s *Server) supersedeDeparted(ctx context.Context, pods []string, before time.Time, why string) error {
	ctx, cancel := context.WithTimeout(ctx, stopDocumentTimeout)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, s.opts.EventsURL, true)
	if err != nil {
		return err
	}
	defer b.Close()
	moved, err := kferrors.SupersedePods(ctx, b, pods, before)
	if len(moved) > 0 {
		s.log.Info("departed pods' failures are recovered: their documents moved aside", "why", why, "pods", pods,
			"to", kferrors.SupersededPrefix, "keys", moved)
	}
	return err
}
