// Package e2e runs Flyte workflows end to end: a real flytepropeller with
// the kfelastic plugin linked in (cmd/flytepropeller-kfelastic, started by
// kubeenv.StartPropeller with propeller's own configuration and no
// flyteadmin) creates the training jobs of FlyteWorkflow objects compiled
// by propeller's own compiler (kubeenv.TaskWorkflow), and the tests read
// the outcome from the workflow's node status, which is what the Flyte UI
// shows.
//
// The loop of a test:
//
//	cfg := kubeenv.Kube(t)                      // kube-apiserver + etcd, Kubeflow CRDs
//	kubeenv.StartOperator(t, cfg)               // the training operator
//	p := kubeenv.StartPropeller(t, kubeenv.PropellerOptions{
//		Kubeconfig: kubeenv.Kubeconfig(t, cfg), Store: testenv.MinIO(t), Namespace: ns})
//	fw, _ := kubeenv.TaskWorkflow(flytetest.LoadTemplate(t, "pytorch-v1-elastic-3-4"),
//		kubeenv.WorkflowOptions{Namespace: ns})
//	c.Create(ctx, fw)
//	o, _ := kubeenv.WaitOutcome(ctx, c, client.ObjectKeyFromObject(fw), func(o kubeenv.WorkflowOutcome) bool { … })
//
// `make e2e` runs them; `make test` includes them. They skip under -short.
// The scenarios E1–E8 (elastic_test.go) run on a one-node Kubernetes whose
// pods really run (kubeenv.UseCluster): each creates a FlyteWorkflow,
// flytepropeller hands it to the plugin, which builds the job, the real
// training operator creates the pods, the kubelet runs `kfelastic install`,
// `kfelastic agent`, `kfelastic master` and torch in them, and each
// scenario injects a fault a user meets on a real cluster and asserts what
// the user sees. bench_test.go is `make bench-e2e`: E4's fault beside
// upstream's PyTorch plugin in the same propeller.
package e2e
