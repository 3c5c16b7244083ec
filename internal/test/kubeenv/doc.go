// Package kubeenv starts the Kubernetes and Flyte side of the tests: a
// kube-apiserver + etcd with the Kubeflow CRDs (kube.go: Kube(t), StartKube
// for benchmarks), the training operator (operator.go), flytepropeller with
// the plugin (propeller.go), FlyteWorkflows compiled by propeller's own
// compiler (flyteworkflow.go), simulated nodes (nodesim.go) and the
// one-node cluster whose pods really run (cluster.go: UseCluster).
//
// What it starts for a test binary is stopped by testenv.Main, which the
// package's TestMain must call:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// It is apart from testenv because its ≈1,100 packages made every test
// binary larger and slower to start, the re-executed ones included.
package kubeenv
