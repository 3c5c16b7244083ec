// Package e2e runs Flyte workflows end to end: a real flytepropeller with
// the kfelastic plugin linked in (cmd/flytepropeller-kfelastic, started by
// testenv.StartPropeller with propeller's own configuration and no
// flyteadmin) creates the training jobs of FlyteWorkflow objects compiled
// by propeller's own compiler (testenv.TaskWorkflow), and the tests read
// the outcome from the workflow's node status, which is what the Flyte UI
// shows.
//
// The loop of a test:
//
//	cfg := testenv.Kube(t)                      // kube-apiserver + etcd, Kubeflow CRDs
//	testenv.StartOperator(t, cfg)               // the training operator
//	p := testenv.StartPropeller(t, testenv.PropellerOptions{
//		Kubeconfig: testenv.Kubeconfig(t, cfg), Store: testenv.MinIO(t), Namespace: ns})
//	fw, _ := testenv.TaskWorkflow(flytetest.LoadTemplate(t, "pytorch-v1-elastic-3-4"),
//		testenv.WorkflowOptions{Namespace: ns})
//	c.Create(ctx, fw)
//	o, _ := testenv.WaitOutcome(ctx, c, client.ObjectKeyFromObject(fw), func(o testenv.WorkflowOutcome) bool { … })
//
// `make e2e` runs them; `make test` includes them. They skip under -short.
package e2e
