package kube

import (
	"context"
	"log/slog"

	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

// MasterOwner is the master's PodOwner on Kubernetes: it turns the master's
// decisions into Actions for the Owner, and the pods the Owner sees die
// into the master's PodGone.
type MasterOwner struct {
	owner *Owner
	log   *slog.Logger
}

// NewMasterOwner wraps an Owner for a master.
func NewMasterOwner(o *Owner, log *slog.Logger) *MasterOwner {
	if log == nil {
		log = slog.Default()
	}
	return &MasterOwner{owner: o, log: log}
}

// Carry carries out one decision; a decision that can never be carried out
// (at the OOM cap, a job without the replica) is logged and dropped, as
// retrying it would not help.
func (k *MasterOwner) Carry(ctx context.Context, d master.Decision) error {
	if d.Kind == master.StopJob || d.Kind == relaunch.None {
		return nil
	}
	err := k.owner.Carry(ctx, Action{Seq: d.Seq, Kind: d.Kind, Rank: d.Rank, Pod: d.Pod, Host: d.Host, Reason: d.Reason, Time: d.Time})
	if err != nil && Permanent(err) {
		k.log.Error("decision cannot be carried out on Kubernetes", "seq", d.Seq, "kind", master.KindName(d.Kind), "pod", d.Pod, "err", err)
		return nil
	}
	return err
}

// WatchFor reports to s, until ctx ends, the job's pods that die without
// their agent saying so (OOMKilled, evicted, deleted, node lost).
func (k *MasterOwner) WatchFor(ctx context.Context, s *master.Server) {
	err := k.owner.Watch(ctx, func(g PodGone) {
		go func() {
			if err := s.PodGone(ctx, g.Pod, g.Failure); err != nil && ctx.Err() == nil {
				k.log.Warn("cannot report a pod's end to the master", "pod", g.Pod, "err", err)
			}
		}()
	})
	if err != nil && ctx.Err() == nil {
		k.log.Error("pod watch ended", "err", err)
	}
}
