// Package kube is the kfelastic master's pod owner on Kubernetes (docs/DESIGN.md
// §5.6): it carries out the master's relaunch decisions for one PyTorchJob
// and reports worker pods that died without their agent saying so.
//
// The training operator (restart policy ExitCode) recreates a worker pod
// that exits with a code ≥ 128 or is deleted, under the same name
// <job>-worker-<index>, from the job's current replica template. So the
// owner carries out decisions by editing the template and deleting pods:
// OOM → more memory in the template (relaunch.OOM's arithmetic, the one
// kfoperator uses), faulty node → a required node anti-affinity to its host,
// then the index's pod is deleted unless it already satisfies the decision.
//
// It links into the one kfelastic binary that also runs in every training
// pod, so it speaks to the API server with a small REST client on net/http
// (pods decoded into local structs, the job edited as JSON) instead of
// client-go, and needs only what kfoperator.MasterObjects' Role grants: get,
// update on its PyTorchJob; get, list, watch, delete on pods.
//
// The master wires it like this:
//
//	cfg, err := kube.InCluster(namespace, job) // flags --namespace, --job
//	cfg.OOM = policy.OOM
//	owner, err := kube.New(cfg)
//	go owner.Watch(ctx, func(g kube.PodGone) { master.PodGone(g.Pod, g.Failure, now) })
//	for d := range decisions {
//		for err := owner.Carry(ctx, action(d)); err != nil && !kube.Permanent(err); err = owner.Carry(ctx, action(d)) {
//			backoff()
//		}
//	}
package kube
