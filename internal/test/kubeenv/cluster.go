package kubeenv

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/kfelastic/kfelastic/internal/ociimage"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/internal/version"
)

// The one-node cluster: a Kubernetes whose pods really run, for the
// end-to-end tests (e2e/). etcd and kube-apiserver, kube-controller-manager
// (endpoint slices for DNS, garbage collection, service accounts and their
// CA), kube-scheduler, a kubelet on Debian's containerd and runc, pods on a
// CNI bridge, and CoreDNS for the training operator's headless services;
// scripts/deps.sh cluster installs and builds them. Images come from no
// registry: the pause image, the agent image and the worker image (a
// Debian root file system with python3-torch) are built here and imported.
//
// Without kube-proxy, the one ClusterIP pods need is the API server's: the
// service range's first address (the `kubernetes` Service) is also an
// address of the host's bridge, and the API server listens on 443 there,
// so in-cluster credentials (the kfelastic master's) work unchanged. The
// operator's services are headless: CoreDNS answers them with pod IPs.
//
// One cluster runs on a machine at a time (a lock in the cache); it lives
// in $CACHE/cluster/run, and everything it leaves behind — processes,
// mounts, network namespaces, cgroups, the bridge — is removed when it
// stops and again before the next start (after a SIGKILLed test binary).
const (
	// ClusterNodeIP is the host as pods see it: the bridge's gateway, where
	// CoreDNS answers and test servers the pods use (MinIO) listen.
	ClusterNodeIP = "10.77.0.1"
	// ClusterNodeName is the one node's name.
	ClusterNodeName = "kfe-node"
	// PauseImage is the sandbox image the cluster builds (pause/).
	PauseImage = "kfelastic.local/pause:1"
	// InitImage stands in for the training operator's init container image
	// (alpine, which waits for the master's DNS name with sh and nslookup):
	// the worker root with busybox's nslookup. Start the operator with
	// --pytorch-init-container-image=InitImage.
	InitImage = "kfelastic.local/init:1"

	clusterBridge = "kfe0"
	// bridgeMAC is the bridge's own address, set once (locally
	// administered). A bridge whose address the kernel chose takes the
	// lowest of its ports' instead, so it changed whenever a pod's veth came
	// or went with a lower one: the pods' ARP entries for the node then
	// named a MAC nobody answered to until the kernel probed again, and a
	// pod's connection to the node (MinIO, the API server) went unanswered
	// for ≈6.6 s (TCP retransmits while the neighbour entry went from
	// DELAY to PROBE). A master's state check stalled that long just after
	// a pod was deleted, in 3 of 8 bench-e2e runs; docker and the CNI
	// bridge plugin set their bridges' address for the same reason.
	bridgeMAC         = "02:6b:66:65:00:01"
	podSubnet         = "10.77.0.0/16"
	serviceSubnet     = "10.78.0.0/24"
	kubernetesService = "10.78.0.1"
	apiServerPort     = 443
	clusterDomain     = "cluster.local"
	adminToken        = "kfelastic-e2e-admin"
)

// Cluster is a running one-node cluster.
type Cluster struct {
	// Config is the API server's admin config, from the host.
	Config *rest.Config
	// Kubeconfig is the same as a file, for processes (propeller, the
	// operator).
	Kubeconfig string
	// Leftovers is what the start found of an earlier run (a SIGKILLed
	// test binary) and removed, as UseCluster logs it.
	Leftovers string
	// CPULimits says whether and how the node enforces pods' CPU limits
	// (cpuLimits), as UseCluster logs it at start.
	CPULimits string
	// WorkerImage is the image with Debian's python3-torch and the
	// repository's training scripts under /opt/kfelastic (examples/,
	// testdata/).
	WorkerImage string
	// Flytekit says whether the worker image has real flytekit under
	// FlytekitInPods (flytekitLayer); the scenarios that run it skip
	// without.
	Flytekit bool

	run   string // $CACHE/cluster/run
	sock  string // containerd's socket
	lock  *os.File
	procs []*clusterProc
	mu    sync.Mutex
	minio *testenv.MinIOProcess // on ClusterNodeIP, started by MinIO
	stop  chan struct{}         // ends the pod log mirror
	// buckets counts the buckets MinIO made per name (under mu).
	buckets map[string]int
	// operator is the training operator UseOperator started, once.
	operator    sync.Once
	operatorErr error
}

// UseOperator runs the Kubeflow training operator (StartOperator's) on
// the cluster once, for the cluster's life, so that scenarios running side
// by side in their namespaces share it: two operators would both reconcile
// every job. Its log is the cluster's (Log("training-operator")). args are
// the first caller's.
func (c *Cluster) UseOperator(t testing.TB, args ...string) {
	t.Helper()
	c.operator.Do(func() {
		argv := operatorArgv(t, c.Config, args)
		c.operatorErr = c.start("training-operator", argv[0], []string{"KUBECONFIG=" + c.Kubeconfig}, argv[1:]...)
	})
	if c.operatorErr != nil {
		t.Fatal(c.operatorErr)
	}
}

var theCluster struct {
	sync.Mutex
	c       *Cluster
	err     error
	started bool
}

// UseCluster returns the one-node cluster, started once per test process
// and stopped by testenv.Main. It skips under -short, and skips with what failed
// when the cluster cannot start on this machine (a missing binary names the
// deps.sh step that makes it).
func UseCluster(t testing.TB) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the one-node cluster (run without -short)")
	}
	if !testenv.InMain() {
		t.Fatal("kubeenv.UseCluster: the package's TestMain must call testenv.Main(m) so that the cluster is stopped")
	}
	theCluster.Lock()
	defer theCluster.Unlock()
	if !theCluster.started {
		theCluster.started = true
		testenv.StopAtExit(StopCluster)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		theCluster.c, theCluster.err = StartCluster(ctx)
		cancel()
	}
	if theCluster.err != nil {
		t.Skipf("the one-node cluster cannot start on this machine: %v", theCluster.err)
	}
	t.Logf("the one-node cluster: pods' CPU limits %s; removed at start: %s", theCluster.c.CPULimits, theCluster.c.Leftovers)
	return theCluster.c
}

// StopCluster stops the cluster UseCluster started, if any; idempotent.
func StopCluster() {
	theCluster.Lock()
	defer theCluster.Unlock()
	if theCluster.c != nil {
		theCluster.c.Stop()
		theCluster.c = nil
	}
}

func clusterDir() string { return filepath.Join(testenv.CacheDir(), "cluster") }

// clusterLogs holds the cluster's processes' logs, kept until the next start.
func clusterLogs() string { return filepath.Join(clusterDir(), "logs") }

// clusterBinaries are what the cluster runs, and the deps.sh step that
// provides each.
func clusterBinaries() map[string]string {
	k8s := filepath.Join(testenv.CacheDir(), "k8s")
	return map[string]string{
		filepath.Join(k8s, "etcd"):                                                 "scripts/deps.sh k8s",
		filepath.Join(k8s, "kube-apiserver"):                                       "scripts/deps.sh k8s",
		filepath.Join(k8s, "kubelet"):                                              "scripts/deps.sh cluster",
		filepath.Join(k8s, "kube-scheduler"):                                       "scripts/deps.sh cluster",
		filepath.Join(k8s, "kube-controller-manager"):                              "scripts/deps.sh cluster",
		filepath.Join(testenv.CacheDir(), "bin", "coredns"):                        "scripts/deps.sh cluster",
		"/usr/bin/containerd":                                                      "scripts/deps.sh cluster (Debian's containerd)",
		"/usr/bin/ctr":                                                             "scripts/deps.sh cluster (Debian's containerd)",
		"/usr/lib/cni/bridge":                                                      "scripts/deps.sh cluster (Debian's containernetworking-plugins)",
		filepath.Join(workerRoot(), "usr", "bin", "python3"):                       "scripts/deps.sh cluster (the worker root file system)",
		filepath.Join(testenv.CacheDir(), "crds", "kubeflow.org_pytorchjobs.yaml"): "scripts/deps.sh k8s",
	}
}

func workerRoot() string { return filepath.Join(testenv.CacheDir(), "worker-root") }

// StartCluster starts the one-node cluster: leftovers of an earlier run are
// removed first; it returns when the node is Ready, DNS answers and the
// images are imported. Stop it with Stop.
func StartCluster(ctx context.Context) (_ *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the kubelet, containerd and the pods' network need root")
	}
	var missing []string
	for bin, step := range clusterBinaries() {
		if _, err := os.Stat(bin); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%s)", bin, step))
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("missing: %s", strings.Join(missing, ", "))
	}
	if err := os.MkdirAll(clusterDir(), 0o755); err != nil {
		return nil, err
	}
	lock, err := lockFile(ctx, filepath.Join(clusterDir(), "lock"))
	if err != nil {
		return nil, err
	}
	c := &Cluster{run: filepath.Join(clusterDir(), "run"), lock: lock}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	removed, err := cleanCluster(c.run)
	if err != nil {
		return nil, fmt.Errorf("leftovers of an earlier cluster: %w", err)
	}
	c.Leftovers = "none"
	if len(removed) > 0 {
		c.Leftovers = strings.Join(removed, ", ")
	}
	// The processes' logs outlive the run folder (a failed start is read
	// after the cleanup): one folder, emptied at each start.
	if err := os.RemoveAll(clusterLogs()); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(clusterLogs(), 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{"pki", "etcd", "kubelet", "pod-logs", "cni/net.d", "cni/ipam", "containerd-state"} {
		if err := os.MkdirAll(filepath.Join(c.run, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := c.bridge(); err != nil {
		return nil, err
	}
	pki, err := c.certificates()
	if err != nil {
		return nil, err
	}
	if err := c.startControlPlane(ctx, pki); err != nil {
		return nil, err
	}
	if err := c.startContainerd(ctx); err != nil {
		return nil, err
	}
	if err := c.importImages(ctx); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	if err := c.startNode(ctx, pki); err != nil {
		return nil, err
	}
	return c, nil
}

// lockFile holds an exclusive lock on path until the file is closed: one
// cluster per machine, whichever test process starts it.
func lockFile(ctx context.Context, path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			return f, nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("another test process holds the cluster (%s): %w", path, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// bridge creates the pods' bridge with the node's address and the
// kubernetes Service's address, so that both reach the host.
func (c *Cluster) bridge() error {
	for _, args := range [][]string{
		{"link", "add", clusterBridge, "type", "bridge"},
		{"link", "set", clusterBridge, "address", bridgeMAC},
		{"addr", "add", ClusterNodeIP + "/16", "dev", clusterBridge},
		{"addr", "add", kubernetesService + "/32", "dev", clusterBridge},
		{"link", "set", clusterBridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// clusterPKI is the cluster's certificate authority, the API server's
// serving certificate, and the service-account signing key, as files.
type clusterPKI struct {
	ca, caKey, serving, servingKey, saKey, saPub, tokens string
}

func (c *Cluster) certificates() (clusterPKI, error) {
	dir := filepath.Join(c.run, "pki")
	p := clusterPKI{
		ca: filepath.Join(dir, "ca.crt"), caKey: filepath.Join(dir, "ca.key"),
		serving: filepath.Join(dir, "apiserver.crt"), servingKey: filepath.Join(dir, "apiserver.key"),
		saKey: filepath.Join(dir, "sa.key"), saPub: filepath.Join(dir, "sa.pub"), tokens: filepath.Join(dir, "tokens.csv"),
	}
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return p, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kfelastic-e2e-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return p, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return p, err
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + clusterDomain},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(ClusterNodeIP), net.ParseIP(kubernetesService)}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return p, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return p, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return p, err
	}
	for path, block := range map[string]*pem.Block{
		p.ca: {Type: "CERTIFICATE", Bytes: caDER}, p.caKey: {Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(caKey)},
		p.serving: {Type: "CERTIFICATE", Bytes: srvDER}, p.servingKey: {Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(srvKey)},
		p.saKey: {Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}, p.saPub: {Type: "PUBLIC KEY", Bytes: saPub},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return p, err
		}
	}
	// The admin (tests, controllers, the kubelet, propeller): one static
	// token in system:masters. Pods get service-account tokens.
	return p, os.WriteFile(p.tokens, []byte(adminToken+",admin,admin,system:masters\n"), 0o600)
}

func (c *Cluster) startControlPlane(ctx context.Context, pki clusterPKI) error {
	etcdPort, err := testenv.FreePortNumber()
	if err != nil {
		return err
	}
	peerPort, err := testenv.FreePortNumber()
	if err != nil {
		return err
	}
	k8s := filepath.Join(testenv.CacheDir(), "k8s")
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	if err := c.start("etcd", filepath.Join(k8s, "etcd"), nil,
		"--data-dir", filepath.Join(c.run, "etcd"), "--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort), "--unsafe-no-fsync=true"); err != nil {
		return err
	}
	if err := c.start("kube-apiserver", filepath.Join(k8s, "kube-apiserver"), nil,
		"--etcd-servers", etcdURL, "--bind-address", "0.0.0.0", "--secure-port", strconv.Itoa(apiServerPort),
		"--advertise-address", ClusterNodeIP, "--service-cluster-ip-range", serviceSubnet,
		"--tls-cert-file", pki.serving, "--tls-private-key-file", pki.servingKey, "--client-ca-file", pki.ca,
		"--token-auth-file", pki.tokens, "--authorization-mode", "Node,RBAC", "--allow-privileged=true",
		"--service-account-issuer", "https://kubernetes.default.svc."+clusterDomain,
		"--service-account-key-file", pki.saPub, "--service-account-signing-key-file", pki.saKey,
		"--endpoint-reconciler-type", "lease", "--enable-priority-and-fairness=false", "--profiling=false"); err != nil {
		return err
	}
	caPEM, err := os.ReadFile(pki.ca)
	if err != nil {
		return err
	}
	c.Config = &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", apiServerPort), BearerToken: adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}, QPS: 50, Burst: 100}
	c.Kubeconfig = filepath.Join(c.run, "kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, c.Config); err != nil {
		return err
	}
	if err := c.waitReady(ctx, "kube-apiserver", 2*time.Minute, func() error { return c.healthy(ctx, "/readyz") }); err != nil {
		return err
	}
	// The Kubeflow CRDs, as for the API server of the other tests.
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(testenv.CacheDir(), "crds")},
		ErrorIfPathMissing: true, Scheme: Scheme()}); err != nil {
		return fmt.Errorf("kubeflow CRDs: %w", err)
	}
	if err := c.start("kube-controller-manager", filepath.Join(k8s, "kube-controller-manager"), nil,
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false", "--use-service-account-credentials=false",
		"--root-ca-file", pki.ca, "--service-account-private-key-file", pki.saKey,
		"--cluster-signing-cert-file", pki.ca, "--cluster-signing-key-file", pki.caKey,
		"--bind-address", "127.0.0.1", "--secure-port", "0", "--controllers", "*,-nodeipam,-cloud-node-lifecycle"); err != nil {
		return err
	}
	return c.start("kube-scheduler", filepath.Join(k8s, "kube-scheduler"), nil,
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0")
}

// writeKubeconfig writes cfg (token or client certificate) as a kubeconfig.
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kfelastic"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["kfelastic"] = &clientcmdapi.Context{Cluster: "kfelastic", AuthInfo: "admin"}
	kc.CurrentContext = "kfelastic"
	return clientcmd.WriteToFile(*kc, path)
}

func (c *Cluster) healthy(ctx context.Context, path string) error {
	rc := rest.CopyConfig(c.Config)
	rc.Timeout = 5 * time.Second
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Config.Host+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, body)
	}
	return nil
}

// containerdConfig is containerd's own configuration: its root (images,
// kept between runs in the cache), its state and socket under the run
// folder, the CRI plugin with the pause image built here and the bridge.
func (c *Cluster) containerdConfig() string {
	root := filepath.Join(clusterDir(), "containerd")
	return fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  enable_selinux = false
  # No lower OOM score than containerd's own: this machine's root may not
  # lower oom_score_adj (no CAP_SYS_RESOURCE), which runc's start of every
  # sandbox (-998) would otherwise fail on.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`, root, filepath.Join(c.run, "containerd-state"), c.sock, filepath.Join(clusterDir(), "containerd-opt"),
		PauseImage, filepath.Join(c.run, "cni", "net.d"))
}

func (c *Cluster) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "kfelastic",
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": %q,
      "ranges": [[{"subnet": %q, "rangeStart": "10.77.1.1", "rangeEnd": "10.77.255.254", "gateway": %q}]],
      "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
`, clusterBridge, filepath.Join(c.run, "cni", "ipam"), podSubnet, ClusterNodeIP)
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	c.sock = filepath.Join(c.run, "containerd.sock")
	conf := filepath.Join(c.run, "containerd.toml")
	if err := os.WriteFile(conf, []byte(c.containerdConfig()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.run, "cni", "net.d", "10-kfelastic.conflist"), []byte(c.cniConfig()), 0o644); err != nil {
		return err
	}
	startIt := func() error {
		if err := c.start("containerd", "/usr/bin/containerd", nil, "--config", conf); err != nil {
			return err
		}
		return c.waitReady(ctx, "containerd", 30*time.Second, func() error {
			_, err := c.ctr(ctx, nil, "version")
			return err
		})
	}
	if err := startIt(); err != nil {
		return err
	}
	// Containers a SIGKILLed run left in the kept root: removed, then
	// containerd restarted so that its CRI plugin forgets them too.
	ids, err := c.ctr(ctx, nil, "containers", "ls", "-q")
	if err != nil {
		return err
	}
	if ids = strings.TrimSpace(ids); ids == "" {
		return nil
	}
	found := fmt.Sprintf("%d containers in containerd", len(strings.Fields(ids)))
	if c.Leftovers == "none" {
		c.Leftovers = found
	} else {
		c.Leftovers += ", " + found
	}
	c.removeContainers(ctx)
	c.stopProc("containerd")
	return startIt()
}

// removeContainers kills and removes every container of the k8s.io
// namespace through containerd (best effort: what remains is killed by
// cgroup at cleanup). ctr takes them all in one call and goes on past the
// ones it cannot delete: `tasks rm -f` SIGKILLs a running task and waits
// for it; a container whose task has exited and been deleted (init
// containers, every container the kubelet stopped) has none, and ctr says
// "no running task found". Each container once retried that 20 times,
// 100 ms apart: ≈400 ctr processes and a minute or more of a test run
// after a job with some 40 containers.
func (c *Cluster) removeContainers(ctx context.Context) {
	for try := range 10 {
		out, err := c.ctr(ctx, nil, "containers", "ls", "-q")
		ids := strings.Fields(out)
		if err != nil || len(ids) == 0 || ctx.Err() != nil {
			return
		}
		if try > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		_, _ = c.ctr(ctx, nil, append([]string{"tasks", "rm", "-f"}, ids...)...)
		_, _ = c.ctr(ctx, nil, append([]string{"containers", "rm"}, ids...)...)
	}
}

// ctr runs containerd's client in the kubelet's namespace.
func (c *Cluster) ctr(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "/usr/bin/ctr", append([]string{"--address", c.sock, "--namespace", "k8s.io"}, args...)...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func (c *Cluster) startNode(ctx context.Context, pki clusterPKI) error {
	// CoreDNS answers the cluster's names; every other name is NXDOMAIN, as
	// an upstream resolver would answer TFJob's "<pod>.<ns>.svc." (with no
	// next plugin CoreDNS says SERVFAIL, and glibc gives up with EAI_AGAIN
	// instead of trying the next candidate). Two server blocks, because
	// CoreDNS orders plugins by its build, not by the Corefile: template
	// would answer before kubernetes in one block.
	corefile := filepath.Join(c.run, "Corefile")
	if err := os.WriteFile(corefile, []byte(fmt.Sprintf(`%[2]s:53 in-addr.arpa:53 ip6.arpa:53 {
    bind %[1]s
    errors
    kubernetes %[2]s in-addr.arpa ip6.arpa {
        kubeconfig %[3]s kfelastic
        pods insecure
    }
    cache 5
}
.:53 {
    bind %[1]s
    template ANY ANY {
        rcode NXDOMAIN
    }
}
`, ClusterNodeIP, clusterDomain, c.Kubeconfig)), 0o644); err != nil {
		return err
	}
	if err := c.start("coredns", filepath.Join(testenv.CacheDir(), "bin", "coredns"), nil, "-conf", corefile); err != nil {
		return err
	}
	resolv := filepath.Join(c.run, "resolv.conf")
	if err := os.WriteFile(resolv, nil, 0o644); err != nil {
		return err
	}
	kubeletConf := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
		"cgroupDriver": "cgroupfs", "failSwapOn": false, "failCgroupV1": false,
		"containerRuntimeEndpoint": "unix://" + c.sock,
		"clusterDNS":               []string{ClusterNodeIP}, "clusterDomain": clusterDomain, "resolvConf": resolv,
		"authentication": map[string]any{"anonymous": map[string]any{"enabled": true}, "webhook": map[string]any{"enabled": false},
			"x509": map[string]any{"clientCAFile": pki.ca}},
		"authorization": map[string]any{"mode": "AlwaysAllow"},
		// A busy shared disk must not evict the tests' pods.
		"evictionHard":                map[string]string{"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		"imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
		"podLogsDir": filepath.Join(c.run, "pod-logs"), "readOnlyPort": 0, "healthzPort": 0,
		"serializeImagePulls": false, "syncFrequency": "10s", "nodeStatusUpdateFrequency": "5s",
		"fileCheckFrequency": "5s", "volumeStatsAggPeriod": "0s", "cpuManagerReconcilePeriod": "5s",
		"localStorageCapacityIsolation": true, "maxPods": 50, "runtimeRequestTimeout": "5m",
		// As on every real cluster: a container's CPU limit is a CFS quota.
		"cpuCFSQuota": true,
	}
	enableCPUController()
	b, err := yaml.Marshal(kubeletConf)
	if err != nil {
		return err
	}
	conf := filepath.Join(c.run, "kubelet.yaml")
	if err := os.WriteFile(conf, b, 0o644); err != nil {
		return err
	}
	c.stop = make(chan struct{})
	go c.mirrorPodLogs(c.stop)
	if err := c.start("kubelet", filepath.Join(testenv.CacheDir(), "k8s", "kubelet"), nil,
		"--config", conf, "--kubeconfig", c.Kubeconfig, "--root-dir", filepath.Join(c.run, "kubelet"),
		"--cert-dir", filepath.Join(c.run, "pki", "kubelet"), "--hostname-override", ClusterNodeName,
		"--node-ip", ClusterNodeIP, "--v", "1"); err != nil {
		return err
	}
	kc, err := client.New(c.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		return err
	}
	if err := c.waitReady(ctx, "kubelet (node Ready)", 3*time.Minute, func() error {
		var n corev1.Node
		if err := kc.Get(ctx, client.ObjectKey{Name: ClusterNodeName}, &n); err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s: %s", cond.Reason, cond.Message)
			}
		}
		return errors.New("node has no Ready condition yet")
	}); err != nil {
		return err
	}
	c.CPULimits = cpuLimits()
	// Pods need their namespace's default service account and the CA
	// bundle the controller-manager publishes.
	return c.waitReady(ctx, "kube-controller-manager (service accounts)", 2*time.Minute, func() error {
		var sa corev1.ServiceAccount
		if err := kc.Get(ctx, client.ObjectKey{Namespace: "default", Name: "default"}, &sa); err != nil {
			return err
		}
		var cm corev1.ConfigMap
		return kc.Get(ctx, client.ObjectKey{Namespace: "default", Name: "kube-root-ca.crt"}, &cm)
	})
}

// Namespace creates a namespace for one test and waits for what its pods
// need (the default service account, the CA bundle); it is deleted at the
// test's end.
func (c *Cluster) Namespace(t testing.TB, name string) string {
	t.Helper()
	kc := NewClient(t, c.Config)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	// The same test run again (-count) finds its last namespace still
	// terminating, where nothing can be created: wait until it is gone.
	if err := c.waitReady(ctx, "namespace "+name+" (an earlier one terminating)", 2*time.Minute, func() error {
		var old corev1.Namespace
		if err := kc.Get(ctx, client.ObjectKey{Name: name}, &old); err == nil && old.DeletionTimestamp != nil {
			return fmt.Errorf("still terminating since %s", old.DeletionTimestamp)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := kc.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := c.waitReady(ctx, "namespace "+name, time.Minute, func() error {
		var sa corev1.ServiceAccount
		if err := kc.Get(ctx, client.ObjectKey{Namespace: name, Name: "default"}, &sa); err != nil {
			return err
		}
		var cm corev1.ConfigMap
		return kc.Get(ctx, client.ObjectKey{Namespace: name, Name: "kube-root-ca.crt"}, &cm)
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = kc.Delete(ctx, ns)
	})
	return name
}

// clusterMinIODir is where the cluster's MinIO keeps its data: in memory
// (/dev/shm, where it is a tmpfs with 1 GiB free), else a temporary folder.
// On the one disk this machine has, MinIO's fsync waited up to 7 s behind
// a pod's start (containerd's snapshots, the agent binary's copy), and the
// master's state with it (make bench-e2e: "the master could not answer
// while it waited on its state"); an S3 service shares no disk with the
// nodes. One cluster runs at a time, so the folder is fixed, and a killed
// run's is emptied at the next start.
func clusterMinIODir() string {
	const shm = "/dev/shm"
	var fs syscall.Statfs_t
	const tmpfsMagic = 0x01021994
	if err := syscall.Statfs(shm, &fs); err != nil || fs.Type != tmpfsMagic || uint64(fs.Bavail)*uint64(fs.Bsize) < 1<<30 {
		return ""
	}
	return filepath.Join(shm, "kfelastic-cluster-minio")
}

// MinIO is a MinIO server the pods reach (on ClusterNodeIP), started on
// first use and stopped with the cluster, and a fresh bucket on it; its
// credentials are in this process's environment (testenv.SetCredentialEnv) and go
// to pods as the AWS_* variables of PodCredentialEnv.
func (c *Cluster) MinIO(t testing.TB) *testenv.MinIOServer {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.minio == nil {
		testenv.SetCredentialEnv()
		p, err := testenv.StartMinIOAt(t.Context(), testenv.MinIOBinary(), ClusterNodeIP, clusterMinIODir())
		if err != nil {
			t.Fatal(err)
		}
		c.minio = p
	}
	bucket := "e2e-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	if len(bucket) > 50 {
		bucket = bucket[:50]
	}
	bucket = strings.Trim(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, bucket), "-")
	// The same test run again (-count) gets a bucket of its own: the
	// last run's documents are not this one's.
	if c.buckets == nil {
		c.buckets = map[string]int{}
	}
	if c.buckets[bucket]++; c.buckets[bucket] > 1 {
		bucket = fmt.Sprintf("%s-%d", bucket, c.buckets[bucket])
	}
	if err := c.minio.CreateBucket(t.Context(), bucket); err != nil {
		t.Fatal(err)
	}
	return &testenv.MinIOServer{MinIOProcess: c.minio, Bucket: bucket, URL: c.minio.URL(bucket, ""),
		AccessKey: testenv.MinIOAccessKey, SecretKey: testenv.MinIOSecretKey, Region: testenv.MinIORegion}
}

// PodCredentialEnv are the MinIO credentials as a pod's environment (what a
// Flyte deployment puts in propeller's default-env-vars).
func PodCredentialEnv() []corev1.EnvVar {
	return []corev1.EnvVar{{Name: "AWS_ACCESS_KEY_ID", Value: testenv.MinIOAccessKey}, {Name: "AWS_SECRET_ACCESS_KEY", Value: testenv.MinIOSecretKey},
		{Name: "AWS_REGION", Value: testenv.MinIORegion}, {Name: "AWS_EC2_METADATA_DISABLED", Value: "true"}}
}

// PodLogs is what the containers of pod ns/name printed (container "" for
// all of them), every run of each in order, read from the kubelet's log
// files (the CRI format's time, stream and tag are cut), so a test reads a
// log even after the pod is gone and without the kubelet's API.
func (c *Cluster) PodLogs(ns, pod, container string) string {
	dirs, _ := filepath.Glob(filepath.Join(clusterLogs(), "pods", ns+"_"+pod+"_*"))
	var b strings.Builder
	for _, d := range dirs {
		pattern := filepath.Join(d, "*", "*.log")
		if container != "" {
			pattern = filepath.Join(d, container, "*.log")
		}
		files, _ := filepath.Glob(pattern)
		sort.Slice(files, func(i, j int) bool {
			if filepath.Dir(files[i]) != filepath.Dir(files[j]) {
				return files[i] < files[j]
			}
			ni, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(files[i]), ".log"))
			nj, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(files[j]), ".log"))
			return ni < nj
		})
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for line := range strings.SplitSeq(string(data), "\n") {
				// <time> <stream> <P|F> <text>
				if parts := strings.SplitN(line, " ", 4); len(parts) == 4 {
					b.WriteString(parts[3])
					if parts[2] == "F" {
						b.WriteByte('\n')
					}
				}
			}
		}
	}
	return b.String()
}

// mirrorPodLogs hard-links every container log file the kubelet writes into
// clusterLogs()/pods, so that the logs of a deleted pod (whose files the
// kubelet removes) stay readable until the next start; a link shares the
// file, so it sees every line written after it was made.
func (c *Cluster) mirrorPodLogs(stop <-chan struct{}) {
	src, dst := filepath.Join(c.run, "pod-logs"), filepath.Join(clusterLogs(), "pods")
	linked := map[string]bool{}
	for {
		_ = filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || linked[path] || !strings.HasSuffix(path, ".log") {
				return nil
			}
			rel, _ := filepath.Rel(src, path)
			to := filepath.Join(dst, rel)
			if os.MkdirAll(filepath.Dir(to), 0o755) == nil && os.Link(path, to) == nil {
				linked[path] = true
			}
			return nil
		})
		select {
		case <-stop:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Log is the tail of one of the cluster's processes' logs (kubelet,
// containerd, kube-apiserver, …), for a failing test's report.
func (c *Cluster) Log(name string, n int) string {
	b, err := os.ReadFile(filepath.Join(clusterLogs(), name+".log"))
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = append([]byte("…"), b[len(b)-n:]...)
	}
	return string(b)
}

// clusterProc is one of the cluster's processes.
type clusterProc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	log    *os.File
}

func (c *Cluster) start(name, bin string, env []string, args ...string) error {
	log, err := os.OpenFile(filepath.Join(clusterLogs(), name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group; killed with the test binary, even SIGKILLed
	// (what it leaves, containers, is removed at the next start).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("%s: %w", name, err)
	}
	p := &clusterProc{name: name, cmd: cmd, exited: make(chan struct{}), log: log}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return nil
}

// waitReady polls ready until it succeeds, the process behind it exits, or
// limit passes; the error says which, with the last answer.
func (c *Cluster) waitReady(ctx context.Context, what string, limit time.Duration, ready func() error) error {
	deadline := time.Now().Add(limit)
	var last error
	for {
		if last = ready(); last == nil {
			return nil
		}
		c.mu.Lock()
		for _, p := range c.procs {
			select {
			case <-p.exited:
				c.mu.Unlock()
				return fmt.Errorf("%s exited while waiting for %s: %s", p.name, what, c.Log(p.name, 3000))
			default:
			}
		}
		c.mu.Unlock()
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not ready after %v: %v", what, limit, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (c *Cluster) stopProc(name string) {
	c.mu.Lock()
	i := slices.IndexFunc(c.procs, func(p *clusterProc) bool { return p.name == name })
	if i < 0 {
		c.mu.Unlock()
		return
	}
	p := c.procs[i]
	c.procs = slices.Delete(c.procs, i, i+1)
	c.mu.Unlock()
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
	p.log.Close()
}

// Stop stops the cluster and removes all it made but the images; idempotent.
func (c *Cluster) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if c.stop != nil {
		close(c.stop)
		c.stop = nil
	}
	for _, name := range []string{"training-operator", "kubelet", "kube-scheduler", "kube-controller-manager", "coredns"} {
		c.stopProc(name)
	}
	if c.sock != "" {
		c.removeContainers(ctx)
	}
	for _, name := range []string{"containerd", "kube-apiserver", "etcd"} {
		c.stopProc(name)
	}
	if c.minio != nil {
		c.minio.Stop()
	}
	_, _ = cleanCluster(c.run)
	if c.lock != nil {
		c.lock.Close()
		c.lock = nil
	}
}

// cleanCluster removes what a cluster run left behind: the processes in its
// pods' cgroups and its containerd shims, mounts under run, the pods'
// network namespaces, the kubelet's cgroups, the bridge, and run itself.
// It is what makes a SIGKILLed test binary harmless to the next start,
// and it says what it found.
func cleanCluster(run string) (removed []string, _ error) {
	var errs []error
	found := func(n int, what string) {
		if n > 0 {
			removed = append(removed, fmt.Sprintf("%d %s", n, what))
		}
	}
	// Every process in the pods' cgroups (cgroup v1 hierarchies and v2).
	cgroups := kubepodsCgroups()
	killed := map[int]bool{}
	for range 3 {
		for _, cg := range cgroups {
			for _, pid := range killCgroup(cg) {
				killed[pid] = true
			}
		}
	}
	found(len(killed), "pod processes")
	// The cluster's own processes (etcd, the API server, the kubelet,
	// containerd and its shims: their command lines name the run folder)
	// outlive a SIGKILLed test binary whose Pdeathsig did not reach them.
	procs := procsMatching(run)
	for _, pid := range procs {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	found(len(procs), "cluster processes")
	// Mounts under the run folder and the kubelet's (deepest first), and
	// the pods' network namespaces.
	mounts := mountsUnder(run, "/run/netns/cni-", "/var/run/netns/cni-")
	found(len(mounts), "mounts")
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	for _, dir := range []string{"/run/netns", "/var/run/netns"} {
		if names, _ := filepath.Glob(filepath.Join(dir, "cni-*")); len(names) > 0 {
			found(len(names), "network namespaces in "+dir)
			for _, n := range names {
				_ = os.Remove(n)
			}
		}
	}
	for _, cg := range cgroups {
		removeCgroup(cg)
	}
	found(len(cgroups), "kubepods cgroups")
	if _, err := net.InterfaceByName(clusterBridge); err == nil {
		removed = append(removed, "the bridge "+clusterBridge)
		if out, err := exec.Command("ip", "link", "del", clusterBridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %v: %s", clusterBridge, err, out))
		}
	}
	if _, err := os.Stat(run); err == nil {
		removed = append(removed, "the run folder")
	}
	if err := os.RemoveAll(run); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// cpuLimits says whether the kubelet's pods get their CPU limits as a CFS
// quota here, as every real cluster's do: whether the cpu controller
// governs its kubepods cgroup. The e2e tasks ask for what they need and
// pass either way; a machine without it runs them faster than a cluster
// would, so it is said.
func cpuLimits() string {
	for _, m := range readMounts() {
		for _, f := range []string{"cpu.cfs_quota_us", "cpu.max"} {
			if p := filepath.Join(m.dir, "kubepods", f); (m.fstype == "cgroup" || m.fstype == "cgroup2") && fileExists(p) {
				return "enforced (" + p + ")"
			}
		}
	}
	return "NOT enforced: no cpu controller in the kubelet's kubepods cgroup on this machine (a real cluster enforces them)"
}

// enableCPUController turns the cpu controller on for the children of
// each cgroup v2 hierarchy's root, where the kubelet makes kubepods, so
// that a v2 machine enforces CPU limits as a real node does; where it
// cannot (v1, a delegated tree), cpuLimits says what the node does.
func enableCPUController() {
	for _, m := range readMounts() {
		if m.fstype != "cgroup2" {
			continue
		}
		ctl := filepath.Join(m.dir, "cgroup.subtree_control")
		if b, err := os.ReadFile(filepath.Join(m.dir, "cgroup.controllers")); err == nil && slices.Contains(strings.Fields(string(b)), "cpu") {
			_ = os.WriteFile(ctl, []byte("+cpu"), 0o644)
		}
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// kubepodsCgroups are the kubelet's pod cgroups (cgroupfs driver) in every
// mounted hierarchy.
func kubepodsCgroups() []string {
	var out []string
	for _, m := range readMounts() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			if _, err := os.Stat(filepath.Join(m.dir, "kubepods")); err == nil {
				out = append(out, filepath.Join(m.dir, "kubepods"))
			}
		}
	}
	return out
}

// killCgroup SIGKILLs every process in the cgroup tree at dir, and says
// which.
func killCgroup(dir string) (pids []int) {
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for f := range strings.FieldsSeq(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// removeCgroup removes the cgroup tree at dir, leaves first, waiting a
// little for killed processes to leave.
func removeCgroup(dir string) {
	var dirs []string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		for range 50 {
			if err := syscall.Rmdir(dirs[i]); err == nil || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// procsMatching are the processes whose command line contains s.
func procsMatching(s string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

type mountEntry struct{ dir, fstype string }

func readMounts() []mountEntry {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts … - fstype source opts
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		out = append(out, mountEntry{dir: unescapeMount(fields[4]), fstype: fields[sep+1]})
	}
	return out
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountsUnder are the mount points under dir or starting with one of the
// prefixes, deepest first.
func mountsUnder(dir string, prefixes ...string) []string {
	var out []string
	for _, m := range readMounts() {
		if m.dir == dir || strings.HasPrefix(m.dir, dir+"/") || slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(m.dir, p) }) {
			out = append(out, m.dir)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// importImages imports the pause image and the worker image into
// containerd unless it already has them (its root is kept in the cache).
func (c *Cluster) importImages(ctx context.Context) error {
	have, err := c.ctr(ctx, nil, "images", "ls", "-q")
	if err != nil {
		return err
	}
	images := filepath.Join(clusterDir(), "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		return err
	}
	// The pause image: built from pause/ every start (the Go build cache
	// makes that cheap) and imported when its digest changed.
	pauseBin := filepath.Join(images, "pause")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", pauseBin, "./pause")
	build.Dir = packageDir()
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build pause: %v: %s", err, out)
	}
	pauseLayer, err := layerOfFiles(filepath.Join(images, "pause.tar"), map[string]string{"pause": pauseBin})
	if err != nil {
		return err
	}
	if err := c.importImage(ctx, have, PauseImage, []ociBlob{pauseLayer}, imageSpec{entrypoint: []string{"/pause"}}); err != nil {
		return err
	}
	// The worker image: Debian's root file system (one layer, written once
	// per root) and the repository's scripts (a second, small one).
	base, err := rootLayer(ctx, filepath.Join(images, "worker-root.tar"))
	if err != nil {
		return err
	}
	scripts, err := scriptsLayer(filepath.Join(images, "scripts.tar"))
	if err != nil {
		return err
	}
	// The operator's init container (sh, seq, sleep and nslookup): Debian's
	// root file system, so its dash runs nslookup from PATH (busybox's own
	// sh would run its built-in applet), plus the busybox nslookup below.
	initLayer, err := busyboxLayer(filepath.Join(images, "init.tar"))
	if err != nil {
		return err
	}
	if err := c.importImage(ctx, have, InitImage, []ociBlob{base, initLayer}, imageSpec{}); err != nil {
		return err
	}
	layers := []ociBlob{base, scripts}
	sum := strings.TrimPrefix(scripts.digest, "sha256:")[:12] + strings.TrimPrefix(base.digest, "sha256:")[:4]
	// Real flytekit, where the cache has it (scripts/deps.sh flytekit) and
	// the root its Debian packages: a third layer, /opt/flytekit.
	if fk, ok, err := flytekitLayer(filepath.Join(images, "flytekit.tar")); err != nil {
		return err
	} else if ok {
		layers, c.Flytekit = append(layers, fk), true
		sum += strings.TrimPrefix(fk.digest, "sha256:")[:4]
	}
	c.WorkerImage = "kfelastic.local/worker:" + sum
	return c.importImage(ctx, have, c.WorkerImage, layers, imageSpec{
		env: []string{"PATH=/opt/kfelastic/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONUNBUFFERED=1"},
	})
}

// FlytekitInPods is where real flytekit is in the worker image
// (flytekitLayer): its site (with the tests' s3:// for fsspec beside it,
// testdata/flytekit/s3) goes on the pod's PYTHONPATH, its pyflyte-execute
// is bin/pyflyte-execute.
const FlytekitInPods = "/opt/flytekit"

// flytekitLayer holds real flytekit (testenv.FlytekitDir: its site and console
// scripts) under FlytekitInPods. ok is false, with no error, when the
// cache has no flytekit or the worker root lacks its Debian packages
// (botocore the last of them, scripts/deps.sh): the scenarios that run it
// then skip (Cluster.Flytekit).
func flytekitLayer(path string) (ociBlob, bool, error) {
	dir := testenv.FlytekitDir()
	if _, err := os.Stat(filepath.Join(dir, "site", "flytekit", "__init__.py")); err != nil {
		return ociBlob{}, false, nil
	}
	if _, err := os.Stat(filepath.Join(workerRoot(), "usr", "lib", "python3", "dist-packages", "botocore")); err != nil {
		return ociBlob{}, false, nil
	}
	l, err := writeLayer(path, func(tw *tar.Writer) error {
		if err := writeTree(tw, filepath.Join(dir, "site"), strings.TrimPrefix(FlytekitInPods, "/")+"/site", map[string]bool{}, true); err != nil {
			return err
		}
		bin := strings.TrimPrefix(FlytekitInPods, "/") + "/bin/"
		if err := tw.WriteHeader(&tar.Header{Name: bin, Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		for _, script := range []string{"pyflyte-execute", "pyflyte-fast-execute"} {
			b, err := os.ReadFile(filepath.Join(dir, script))
			if err != nil {
				return err
			}
			if err := putFile(tw, bin+script, b); err != nil {
				return err
			}
		}
		return nil
	})
	return l, err == nil, err
}

// ImportAgentImage builds the agent image of this tree as `make image`
// does, with version v stamped, imports it, and returns its name: the
// plugin's default agentImage for a plugin built with the same version.
func (c *Cluster) ImportAgentImage(ctx context.Context, v string) (string, error) {
	repo := testenv.ProjectRoot()
	bin, err := ociimage.BuildBinary(ctx, ociimage.BuildOptions{Version: v, Out: filepath.Join(clusterDir(), "images", "kfelastic"), ModuleDir: repo})
	if err != nil {
		return "", err
	}
	img, err := ociimage.Image(bin, ociimage.ImageOptions{Version: v})
	if err != nil {
		return "", err
	}
	blobs, err := imageOf(img)
	if err != nil {
		return "", err
	}
	have, err := c.ctr(ctx, nil, "images", "ls", "-q")
	if err != nil {
		return "", err
	}
	name := version.ImageOf(v)
	return name, c.importArchive(ctx, have, name, blobs)
}

func (c *Cluster) importImage(ctx context.Context, have, name string, layers []ociBlob, spec imageSpec) error {
	img, err := newImage(layers, spec)
	if err != nil {
		return err
	}
	return c.importArchive(ctx, have, name, img)
}

// importArchive streams img into `ctr images import`, unless containerd
// already has name at the same manifest digest.
func (c *Cluster) importArchive(ctx context.Context, have, name string, img ociImage) error {
	if slices.Contains(strings.Fields(have), name) {
		out, err := c.ctr(ctx, nil, "images", "ls", "name=="+name)
		if err == nil && strings.Contains(out, img.manifest.digest) {
			return nil
		}
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeArchive(pw, name, img)) }()
	_, err := c.ctr(ctx, pr, "images", "import", "-")
	pr.Close()
	if err != nil {
		return fmt.Errorf("import %s: %w", name, err)
	}
	return nil
}

// packageDir is this package's source folder (the pause command is built
// from it).
func packageDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// writeLayer writes an uncompressed layer tar at path with fill and returns
// it, digested.
func writeLayer(path string, fill func(*tar.Writer) error) (ociBlob, error) {
	f, err := os.Create(path)
	if err != nil {
		return ociBlob{}, err
	}
	tw := tar.NewWriter(f)
	err = fill(tw)
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return ociBlob{}, err
	}
	return layerFile(path)
}

// putFile writes one regular file of a layer (mode 0755, epoch time).
func putFile(tw *tar.Writer, name string, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// layerOfFiles writes a layer holding each src file at its name (mode
// 0755) and returns it.
func layerOfFiles(path string, files map[string]string) (ociBlob, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	return writeLayer(path, func(tw *tar.Writer) error {
		for _, n := range names {
			b, err := os.ReadFile(files[n])
			if err != nil {
				return err
			}
			if err := putFile(tw, n, b); err != nil {
				return err
			}
		}
		return nil
	})
}

// busyboxLayer is Debian's static busybox at /usr/local/bin/busybox and an
// nslookup beside it that succeeds on an answer: busybox 1.35's nslookup
// fails when any search domain has no answer, even where one had (alpine
// 3.10's, the operator's default image, succeeds). The server's own lines
// are Server: and Address:, an answer's Name:.
func busyboxLayer(path string) (ociBlob, error) {
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return ociBlob{}, err
	}
	nslookup := "#!/bin/sh\n/usr/local/bin/busybox nslookup \"$1\" | grep -q '^Name:'\n"
	return writeLayer(path, func(tw *tar.Writer) error {
		if err := putFile(tw, "usr/local/bin/busybox", b); err != nil {
			return err
		}
		return putFile(tw, "usr/local/bin/nslookup", []byte(nslookup))
	})
}

// rootLayerFormat names what rootLayer writes; a layer stamped with
// another is written again. 2: with the root's Python bytecode (writeTree).
const rootLayerFormat = "format 2"

// rootLayer is the worker root file system as one layer tar at path,
// written again only when the root changed (the modification times of its
// python3-torch's folder and of dpkg's status, which every package
// installed since changed, stamped beside the tar) or the layer's format
// did (rootLayerFormat).
func rootLayer(ctx context.Context, path string) (ociBlob, error) {
	root := workerRoot()
	st, err := os.Stat(filepath.Join(root, "usr", "lib", "python3", "dist-packages", "torch"))
	if err != nil {
		return ociBlob{}, err
	}
	stamp := rootLayerFormat + " " + st.ModTime().UTC().Format(time.RFC3339Nano)
	if st, err := os.Stat(filepath.Join(root, "var", "lib", "dpkg", "status")); err == nil {
		stamp += " " + st.ModTime().UTC().Format(time.RFC3339Nano)
	}
	if b, err := os.ReadFile(path + ".stamp"); err == nil && strings.TrimSpace(string(b)) == stamp {
		if l, err := layerFile(path); err == nil {
			return l, nil
		}
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return ociBlob{}, err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	err = writeTree(tw, root, "", map[string]bool{"proc": true, "sys": true, "dev": true, "run": true, "tmp": true}, true)
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return ociBlob{}, fmt.Errorf("worker root layer: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return ociBlob{}, err
	}
	f.Close()
	if err := os.Rename(tmp, path); err != nil {
		return ociBlob{}, err
	}
	if err := os.WriteFile(path+".stamp", []byte(stamp+"\n"), 0o644); err != nil {
		return ociBlob{}, err
	}
	return layerFile(path)
}

// pyflyteExecute is the worker image's pyflyte-execute: the flytekit
// stand-in (testdata/flytekit/elastic_task.py) in place of flytekit's
// entrypoint, so that the plugin wraps it with the command launcher as it
// does every flytekit task. Of flytekit's own arguments only
// --output-prefix (where its error document goes) is passed on; the
// stand-in's follow "--standin".
const pyflyteExecute = `#!/bin/sh
prefix=
while [ $# -gt 0 ] && [ "$1" != --standin ]; do
	[ "$1" = --output-prefix ] && [ $# -gt 1 ] && prefix=$2
	shift
done
[ $# -gt 0 ] && shift
exec python3 /opt/kfelastic/testdata/flytekit/elastic_task.py --output-prefix "$prefix" "$@"
`

// scriptsLayer holds the repository's examples/ and testdata/ (training
// scripts, the flytekit stand-in) under /opt/kfelastic, and the stand-in's
// pyflyte-execute in /opt/kfelastic/bin (on the image's PATH).
func scriptsLayer(path string) (ociBlob, error) {
	repo := testenv.ProjectRoot()
	return writeLayer(path, func(tw *tar.Writer) error {
		for _, d := range []string{"examples", "testdata"} {
			if err := writeTree(tw, filepath.Join(repo, d), "opt/kfelastic/"+d, map[string]bool{}, false); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: "opt/kfelastic/bin/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		return putFile(tw, "opt/kfelastic/bin/pyflyte-execute", []byte(pyflyteExecute))
	})
}
