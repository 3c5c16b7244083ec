package kubeenv

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

var kube struct {
	sync.Mutex
	env     *envtest.Environment
	cfg     *rest.Config
	err     error
	started bool
}

// StopKube stops the API server if one was started; idempotent.
func StopKube() {
	kube.Lock()
	defer kube.Unlock()
	if kube.env != nil {
		_ = kube.env.Stop()
		kube.env = nil
	}
}

// Scheme knows the core types and the Kubeflow training-operator types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = kubeflowv1.AddToScheme(s)
	return s
}

// Kube returns the config of a real kube-apiserver (etcd from Debian,
// kube-apiserver built by scripts/deps.sh) with the Kubeflow PyTorchJob and
// TFJob CRDs installed, started once per test process through envtest. It
// skips under -short; a missing binary or CRD fails the test with a hint.
func Kube(t testing.TB) *rest.Config {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a kube-apiserver (run without -short)")
	}
	kube.Lock()
	defer kube.Unlock()
	if !testenv.InMain() {
		t.Fatal("kubeenv.Kube: the package's TestMain must call testenv.Main(m) so that the API server is stopped")
	}
	if !kube.started {
		kube.started = true
		testenv.StopAtExit(StopKube)
		kube.env, kube.cfg, kube.err = StartKube()
	}
	if kube.err != nil {
		t.Fatal(kube.err)
	}
	return rest.CopyConfig(kube.cfg)
}

// StartKube starts a kube-apiserver + etcd with the Kubeflow CRDs outside a
// test (benchmarks); the caller stops the environment.
func StartKube() (*envtest.Environment, *rest.Config, error) {
	bin := filepath.Join(testenv.CacheDir(), "k8s")
	crds := filepath.Join(testenv.CacheDir(), "crds")
	for _, f := range []string{filepath.Join(bin, "kube-apiserver"), filepath.Join(bin, "etcd"),
		filepath.Join(crds, "kubeflow.org_pytorchjobs.yaml"), filepath.Join(crds, "kubeflow.org_tfjobs.yaml")} {
		if _, err := os.Stat(f); err != nil {
			return nil, nil, fmt.Errorf("testenv: %s is missing; run scripts/deps.sh k8s (or make deps): %w", f, err)
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    bin,
		CRDDirectoryPaths:        []string{crds},
		ErrorIfCRDPathMissing:    true,
		Scheme:                   Scheme(),
		ControlPlaneStartTimeout: 60 * time.Second,
		ControlPlaneStopTimeout:  20 * time.Second,
	}
	// etcd on loopback without fsync: a test server, started in ≈1 s.
	env.ControlPlane.Etcd = &envtest.Etcd{}
	env.ControlPlane.Etcd.Configure().Append("unsafe-no-fsync", "true")
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, nil, fmt.Errorf("testenv: starting kube-apiserver + etcd from %s: %w", bin, err)
	}
	return env, cfg, nil
}
