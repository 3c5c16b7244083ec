package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"

	kferrors "github.com/kfelastic/kfelastic/errors"

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

// WatchPodWarningsFor hands s, until ctx ends, the Warning events on the
// job's live pods that it acts on (Owner.WatchPodWarnings): a critical GPU
// fault a node daemon reports takes its pod out with the fault as its
// failure (Server.HardwareFault; a user or warning fault is only logged:
// the workload's own error follows), and the node controller's
// NodeNotReady takes the pod out once its agent is silent too
// (Server.NodeNotReady).
func (k *MasterOwner) WatchPodWarningsFor(ctx context.Context, s *master.Server) {
	err := k.owner.WatchPodWarnings(ctx, PodWarnings{
		GPUFault: func(g GPUFault) {
			f, ok := g.Failure()
			if !ok || g.Fault.Severity != kferrors.SeverityCritical {
				return
			}
			go func() {
				if err := s.HardwareFault(ctx, g.Pod, f, eventSuffix(g.EventUID)); err != nil && ctx.Err() == nil {
					k.log.Warn("cannot report a pod's hardware fault to the master", "pod", g.Pod, "err", err)
				}
			}()
		},
		NodeNotReady: func(n NodeNotReady) {
			go func() {
				err := s.NodeNotReady(ctx, master.NodeNotReady{Pod: n.Pod, Node: n.Node, Condition: n.Condition, At: n.At})
				if err != nil && ctx.Err() == nil {
					k.log.Warn("cannot report a pod's node not ready to the master", "pod", n.Pod, "err", err)
				}
			}()
		},
	})
	if err != nil && ctx.Err() == nil {
		k.log.Error("event watch ended", "err", err)
	}
}

// eventSuffix is a document name's suffix for one event: 16 hex
// characters of its UID's hash.
func eventSuffix(uid string) string {
	h := sha256.Sum256([]byte(uid))
	return hex.EncodeToString(h[:8])
}
