package plugin

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
	"go/build"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/flytetest"
	"github.com/kfelastic/kfelastic/internal/testenv"
)

// TestLifecycleWithTrainingOperator runs the real Kubeflow training operator
// and kwok (simulated node and kubelet) against the envtest API server and
// drives a PyTorchJob through flytepropeller's plugin manager: created by
// the plugin, pods created by the operator, bound to the kwok node by the
// test (there is no kube-scheduler here), started by kwok, Running; then one
// worker is OOM-killed (its status set as the kubelet would), the operator
// fails the job, and the plugin reports a system-retryable OOMKilled on that
// worker, synthesized from its pod status since it left no document.
func TestLifecycleWithTrainingOperator(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver, training operator and kwok")
	}
	operator := filepath.Join(testenv.CacheDir(), "bin", "training-operator.v1")
	kwok := filepath.Join(testenv.CacheDir(), "bin", "kwok")
	for _, b := range []string{operator, kwok} {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("%s is missing: run scripts/deps.sh k8s: %v", b, err)
		}
	}
	// kwok's own stage files (node ready; pod Pending → Running; deletion),
	// from its module, which building it downloaded.
	modCache := os.Getenv("GOMODCACHE")
	if modCache == "" {
		modCache = filepath.Join(build.Default.GOPATH, "pkg", "mod")
	}
	stages := filepath.Join(modCache, "sigs.k8s.io", "kwok@v0.8.0", "kustomize", "stage")
	if _, err := os.Stat(stages); err != nil {
		t.Fatalf("kwok stage files missing (run scripts/deps.sh k8s): %v", err)
	}
	e := newManagerEnv(t, "flyte-lifecycle", "pytorch")
	e.cfg.LateDocumentGrace.Duration = 3 * time.Second
	cfg := testenv.Kube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kubeconfig := writeKubeconfig(t, cfg)

	// What the operator expects of its cluster (ENVIRONMENT.md).
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kubeflow"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "training-operator-webhook-cert", Namespace: "kubeflow"}},
		&admissionv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "validator.training-operator.kubeflow.org"}},
	} {
		if err := e.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// The operator's webhook server needs serving certs where the kubelet
	// would mount its Secret; its cert rotator waits for tls.crt there.
	writeServingCert(t, "/tmp/k8s-webhook-server/serving-certs")
	startProcess(t, "training-operator", operator, kubeconfig,
		"--enable-scheme=pytorchjob", "--metrics-bind-address=0", "--health-probe-bind-address=0",
		fmt.Sprintf("--webhook-server-port=%d", freePort(t)))
	startProcess(t, "kwok", kwok, kubeconfig,
		"--kubeconfig="+kubeconfig, "--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--config="+filepath.Join(stages, "node", "fast", "node-initialize.yaml"),
		"--config="+filepath.Join(stages, "pod", "fast", "pod-ready.yaml"),
		"--config="+filepath.Join(stages, "pod", "fast", "pod-delete.yaml"),
		fmt.Sprintf("--server-address=127.0.0.1:%d", freePort(t)))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kwok-node-0",
		Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}, Labels: map[string]string{"type": "kwok"}}}
	if err := e.c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	tctx, job := e.launch(t, "lifecycle", "pytorch-v1-two-workers")
	// Running: the operator made 3 pods, we bind them, kwok runs them.
	phase := waitPhase(ctx, t, e, tctx, job, func(p pluginsCore.PhaseInfo) bool { return p.Phase() == pluginsCore.PhaseRunning })
	t.Logf("running: %v", phase)

	oomAt := time.Now().UTC().Truncate(time.Second)
	// kwok patches the same pod's status concurrently: re-read and retry on a
	// conflict, as a controller would.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		worker := &corev1.Pod{}
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "lifecycle-worker-1"}, worker); err != nil {
			return err
		}
		worker.Status.Phase = corev1.PodFailed
		for i := range worker.Status.ContainerStatuses {
			cs := &worker.Status.ContainerStatuses[i]
			if cs.Name == "pytorch" {
				cs.Ready, cs.Started = false, ptr(false)
				cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137,
					StartedAt: metav1.NewTime(oomAt.Add(-time.Minute)), FinishedAt: metav1.NewTime(oomAt)}}
			}
		}
		return e.c.Status().Update(ctx, worker)
	})
	if err != nil {
		t.Fatal(err)
	}
	// A peer's secondary failure, written a second later.
	e.writeDocument(t, tctx, kferrors.UserError("DistNetworkError", "Connection closed by peer", "lifecycle-worker-0", oomAt.Add(1500*time.Millisecond)))

	final := waitPhase(ctx, t, e, tctx, job, func(p pluginsCore.PhaseInfo) bool { return p.Phase().IsTerminal() })
	checkErr(t, final, pluginsCore.PhaseRetryableFailure, kferrors.CodeOOMKilled, core.ExecutionError_SYSTEM, "lifecycle-worker-1", oomAt,
		"OOMKilled: pod lifecycle-worker-1", "1× DistNetworkError")
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
		t.Fatal(err)
	}
	if c, ok := jobCondition(job); !ok || c.Type != kubeflowv1.JobFailed {
		t.Errorf("the operator left the job at %+v", job.Status.Conditions)
	}

	// An elastic job: the operator renders our master and agent-wrapped
	// workers, pointing the workers' PET_* defaults at the kfelastic master.
	etctx, ejob := e.launch(t, "elastic", "upstream-pytorch-v1-elastic")
	waitPhase(ctx, t, e, etctx, ejob, func(p pluginsCore.PhaseInfo) bool { return p.Phase() == pluginsCore.PhaseRunning })
	var pods corev1.PodList
	if err := e.c.List(ctx, &pods, client.InNamespace(e.ns), client.MatchingLabels{kubeflowv1.JobNameLabel: "elastic"}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, p := range pods.Items {
		seen[p.Name] = true
		c := p.Spec.Containers[0]
		switch p.Name {
		case "elastic-master-0":
			if p.Spec.ServiceAccountName != "elastic-kfelastic-master" || c.Args[0] != "master" {
				t.Errorf("master pod: account %q args %v", p.Spec.ServiceAccountName, c.Args)
			}
		default:
			env := map[string]string{}
			for _, v := range c.Env {
				env[v.Name] = v.Value
			}
			if env["PET_RDZV_ENDPOINT"] != "elastic-master-0:23456" || env["PET_NNODES"] != "1:2" || c.Command[0] != "/kfelastic-bin/kfelastic" {
				t.Errorf("worker pod %s: command %v, PET_RDZV_ENDPOINT %q PET_NNODES %q", p.Name, c.Command, env["PET_RDZV_ENDPOINT"], env["PET_NNODES"])
			}
			installed := false
			for _, ic := range p.Spec.InitContainers {
				installed = installed || ic.Name == "kfelastic-install"
			}
			if !installed {
				t.Errorf("worker pod %s has no kfelastic-install init container", p.Name)
			}
		}
	}
	if !seen["elastic-master-0"] || !seen["elastic-worker-0"] || !seen["elastic-worker-1"] {
		t.Errorf("elastic pods %v", seen)
	}
}

func jobCondition(job *kubeflowv1.PyTorchJob) (kubeflowv1.JobCondition, bool) {
	for i := len(job.Status.Conditions) - 1; i >= 0; i-- {
		if job.Status.Conditions[i].Status == corev1.ConditionTrue {
			return job.Status.Conditions[i], true
		}
	}
	return kubeflowv1.JobCondition{}, false
}

// waitPhase runs propeller's rounds (the plugin manager's Handle) every
// 300 ms, binding the job's pods to the kwok node as a scheduler would,
// until done accepts the phase.
func waitPhase(ctx context.Context, t *testing.T, e *managerEnv, tctx *flytetest.Context, job *kubeflowv1.PyTorchJob, done func(pluginsCore.PhaseInfo) bool) pluginsCore.PhaseInfo {
	t.Helper()
	var last pluginsCore.PhaseInfo
	for {
		var pods corev1.PodList
		if err := e.c.List(ctx, &pods, client.InNamespace(e.ns), client.MatchingLabels{kubeflowv1.JobNameLabel: job.Name}); err != nil {
			t.Fatal(err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Spec.NodeName != "" {
				continue
			}
			b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
				Target: corev1.ObjectReference{Kind: "Node", Name: "kwok-node-0"}}
			if err := e.c.SubResource("binding").Create(ctx, p, b); err != nil && !apierrors.IsConflict(err) {
				t.Fatalf("bind %s: %v", p.Name, err)
			}
		}
		last = e.handle(t, tctx)
		if done(last) {
			return last
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out; last phase %v, %d pods", last, len(pods.Items))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// startProcess runs a server for the test's duration in its own process
// group, stopped with SIGTERM (then SIGKILL) at the end; its output is shown
// if the test fails.
func startProcess(t *testing.T, name, bin, kubeconfig string, args ...string) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = &syncBuffer{b: &out}, &syncBuffer{b: &out}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
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
			t.Logf("%s output:\n%s", name, tail(out.String(), 6000))
		}
	})
}

type syncBuffer struct{ b *bytes.Buffer }

var outputMu = make(chan struct{}, 1)

func (s *syncBuffer) Write(p []byte) (int, error) {
	outputMu <- struct{}{}
	defer func() { <-outputMu }()
	return s.b.Write(p)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// writeServingCert writes a self-signed serving certificate and key.
func writeServingCert(t *testing.T, dir string) {
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
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeKubeconfig turns envtest's admin rest.Config into a kubeconfig file
// for the operator and kwok.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
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
