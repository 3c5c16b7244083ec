// Package testenv starts the real servers tests run against: a MinIO S3
// server (minio.go) and a kube-apiserver + etcd with the Kubeflow CRDs
// (kube.go: Kube(t), StartKube for benchmarks).
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
