package plugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	propellerconfig "github.com/flyteorg/flyte/flytepropeller/pkg/controller/config"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
)

// Propeller may run with a kube-config for another cluster (its data plane):
// the plugin's own objects (the master's Secret, ServiceAccount, Role,
// RoleBinding) must land where propeller creates the job, not where
// $KUBECONFIG or in-cluster credentials point.
func TestClientIsPropellersCluster(t *testing.T) {
	cfg := kubeenv.Kube(t)
	kubeconfig := kubeenv.Kubeconfig(t, cfg)
	// A $KUBECONFIG for a cluster that is not there: used, it fails.
	elsewhere := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(elsewhere, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", elsewhere)

	p := New("pytorch", testConfig(), nil)
	p.propeller = func() *propellerconfig.Config { return &propellerconfig.Config{KubeConfigPath: kubeconfig} }
	kube, err := p.client()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "propeller-cluster"}}
	if err := kube.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("the plugin's client does not reach propeller's cluster: %v", err)
	}
	if err := kubeenv.NewClient(t, cfg).Get(ctx, client.ObjectKeyFromObject(ns), ns); err != nil {
		t.Fatalf("created through the plugin, not found in propeller's cluster: %v", err)
	}

	// A kube-config propeller was given that cannot be read is an error
	// that names it, never a silent fallback to another cluster.
	p = New("pytorch", testConfig(), nil)
	p.propeller = func() *propellerconfig.Config {
		return &propellerconfig.Config{KubeConfigPath: filepath.Join(t.TempDir(), "missing")}
	}
	if _, err := p.client(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing kube-config: %v, want an error naming it", err)
	}
}
