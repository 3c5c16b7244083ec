package kube_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/kfelastic/kfelastic/master/kube"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

// The master's wiring on Kubernetes: the pod's service account, a Watch
// feeding the master's PodGone, and each decision carried until done.
func Example() {
	ctx := context.Background()
	cfg, err := kube.InCluster("", "my-job") // flags --kube-namespace, --kube-job
	if err != nil {
		slog.Error("not in a pod", "err", err)
		return
	}
	cfg.OOM = relaunch.DefaultPolicy.OOM // the master's own policy
	owner, err := kube.New(cfg)
	if err != nil {
		slog.Error("kube owner", "err", err)
		return
	}
	go func() {
		_ = owner.Watch(ctx, func(g kube.PodGone) {
			// master: job.PodGone(g.Pod, g.Failure, now)
		})
	}()
	a := kube.Action{Seq: 1, Kind: relaunch.MoreMemory, Pod: "my-job-worker-1", Reason: "OOMKilled", Time: time.Now()}
	for backoff := time.Second; ; backoff = min(2*backoff, 30*time.Second) {
		err := owner.Carry(ctx, a)
		if err == nil || kube.Permanent(err) {
			break
		}
		time.Sleep(backoff)
	}
}
