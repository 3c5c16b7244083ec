// Package testenv is what every test binary needs: the real torches
// (torch.go), a MinIO S3 server (minio.go), the cache and Main. The
// Kubernetes and Flyte side (kube-apiserver, the operator, propeller, the
// one-node cluster) is internal/test/kubeenv, apart: its ≈1,100 packages
// would be linked into, and initialized by, every test binary and every
// re-execution of one as a worker, agent or guardian.
//
// Binaries come from scripts/deps.sh, under $KFELASTIC_CACHE (default
// ~/.cache/kfelastic). Under `go test -short` the helpers skip the test;
// otherwise a missing binary fails it with a hint to run scripts/deps.sh.
// A package that uses a server stops it at the end of the test binary:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		s := testenv.MinIO(t) // one server per process, a fresh bucket per call
//		b, err := blob.OpenBucket(ctx, s.URL)
//		…
//	}
package testenv
