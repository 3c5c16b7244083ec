package kubeenv

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// OperatorBinary is the training operator, as built by scripts/deps.sh k8s.
func OperatorBinary() string { return filepath.Join(testenv.CacheDir(), "bin", "training-operator.v1") }

// servingCertDirs are where the operator looks for its webhook's
// certificates: its cert rotator at a path fixed in the operator
// (pkg/cert), its webhook server at controller-runtime's default, under
// the temp folder it inherits (the test process's own, testenv.Main).
func servingCertDirs() []string {
	return []string{"/tmp/k8s-webhook-server/serving-certs", filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs")}
}

// StartOperator runs the real Kubeflow training operator (PyTorchJob
// controller, cluster-wide) against the API server of cfg for the test's
// duration, after creating what it expects of a cluster (ENVIRONMENT.md):
// the kubeflow namespace, an empty webhook-cert Secret and
// ValidatingWebhookConfiguration, and serving certs on disk. args are added
// to its flags. It skips under -short and fails with a hint when the binary
// is missing.
func StartOperator(t testing.TB, cfg *rest.Config, args ...string) {
	t.Helper()
	argv := operatorArgv(t, cfg, args)
	startProcess(t, "training-operator", argv[0], Kubeconfig(t, cfg), argv[1:]...)
}

// operatorArgv readies the cluster of cfg for the operator (see
// StartOperator) and returns its command line.
func operatorArgv(t testing.TB, cfg *rest.Config, args []string) []string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the Kubeflow training operator (run without -short)")
	}
	bin := OperatorBinary()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s is missing: run scripts/deps.sh k8s: %v", bin, err)
	}
	c := NewClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kubeflow"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "training-operator-webhook-cert", Namespace: "kubeflow"}},
		&admissionv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "validator.training-operator.kubeflow.org"}},
	} {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// Its cert rotator waits for tls.crt where the kubelet would mount the
	// Secret.
	for _, dir := range servingCertDirs() {
		writeServingCert(t, dir)
	}
	port, err := testenv.FreePortNumber()
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{bin, "--enable-scheme=pytorchjob", "--metrics-bind-address=0", "--health-probe-bind-address=0",
		fmt.Sprintf("--webhook-server-port=%d", port)}, args...)
}

// BindPods does a scheduler's job for the test: it binds each unbound pod in
// ns with the given labels to the first of nodes(pod) that the pod's
// required node affinity on kubernetes.io/hostname (In / NotIn) allows. A
// pod no node fits stays pending.
func BindPods(ctx context.Context, c client.Client, ns string, labels map[string]string, nodes func(*corev1.Pod) []string) error {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
		return err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != "" || p.DeletionTimestamp != nil {
			continue
		}
		node := ""
		for _, n := range nodes(p) {
			if HostnameAllowed(p, n) {
				node = n
				break
			}
		}
		if node == "" {
			continue
		}
		b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
			Target: corev1.ObjectReference{Kind: "Node", Name: node}}
		if err := c.SubResource("binding").Create(ctx, p, b); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return fmt.Errorf("bind %s to %s: %w", p.Name, node, err)
		}
	}
	return nil
}

// Nodes is the nodes argument of BindPods for a fixed list.
func Nodes(names ...string) func(*corev1.Pod) []string {
	return func(*corev1.Pod) []string { return names }
}

// HostnameAllowed evaluates the pod's required node affinity on the
// hostname label alone (terms ORed, expressions ANDed).
func HostnameAllowed(p *corev1.Pod, host string) bool {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		return true
	}
	for _, term := range terms {
		ok := true
		for _, r := range term.MatchExpressions {
			if r.Key != "kubernetes.io/hostname" {
				continue
			}
			in := false
			for _, v := range r.Values {
				in = in || v == host
			}
			switch r.Operator {
			case corev1.NodeSelectorOpIn:
				ok = ok && in
			case corev1.NodeSelectorOpNotIn:
				ok = ok && !in
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// Kubeconfig writes the API server's rest.Config as a kubeconfig file (for
// the operator) and returns its path.
func Kubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// NewClient is a controller-runtime client of the API server with the core
// and Kubeflow types.
func NewClient(t testing.TB, cfg *rest.Config) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startProcess runs a server for the test's duration in its own process
// group, stopped with SIGTERM (then SIGKILL) at the end; the tail of its
// output is logged if the test failed.
func startProcess(t testing.TB, name, bin, kubeconfig string, args ...string) {
	t.Helper()
	out := &tailWriter{max: 256 << 10}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.tail(6000))
		}
	})
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if over := w.b.Len() - w.max; over > 0 {
		w.b.Next(over)
	}
	return len(p), nil
}

func (w *tailWriter) tail(n int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.b.String()
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// writeServingCert writes a self-signed serving certificate and key into
// dir, each file replaced atomically (test processes running side by side
// share the operator's fixed directory).
func writeServingCert(t testing.TB, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "training-operator.kubeflow.svc"},
		DNSNames:     []string{"training-operator.kubeflow.svc"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	} {
		tmp, err := os.CreateTemp(dir, "."+name+"-*")
		if err != nil {
			t.Fatal(err)
		}
		_, werr := tmp.Write(data)
		cerr := tmp.Close()
		if werr != nil || cerr != nil {
			t.Fatal(werr, cerr)
		}
		if err := os.Chmod(tmp.Name(), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}
