package kubeenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// PropellerBinary is where BuildPropeller puts flytepropeller with the
// kfelastic plugin (cmd/flytepropeller-kfelastic) of this checkout:
// $KFELASTIC_CACHE/propeller/<hash of the checkout's path>/. One binary per
// checkout, because checkouts (worktrees, other branches) sharing the cache
// would otherwise relink it in turn, or run each other's plugin.
func PropellerBinary() string {
	sum := sha256.Sum256([]byte(testenv.ProjectRoot()))
	return filepath.Join(testenv.CacheDir(), "propeller", hex.EncodeToString(sum[:6]), "flytepropeller-kfelastic")
}

var propellerBuild struct {
	once sync.Once
	err  error
}

// BuildPropeller builds cmd/flytepropeller-kfelastic into PropellerBinary,
// once per test process, and returns its path. `go build -o` does not
// relink a binary that is up to date with its sources (it compares the
// build ID in the file), so a warm call costs the staleness check only
// (seconds); on a cold Go cache it is a link where make test's go vet -race
// compiled the packages first (testenv.RaceBuild), else minutes (8m44s
// measured on 2 loaded cores). Test processes
// building at once take turns (a lock file beside the binary). It skips
// under -short.
func BuildPropeller(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs flytepropeller (run without -short)")
	}
	propellerBuild.once.Do(func() {
		start := time.Now()
		propellerBuild.err = buildPropeller(context.Background(), PropellerBinary())
		if d := time.Since(start); propellerBuild.err == nil && d > 10*time.Second {
			fmt.Fprintf(os.Stderr, "testenv: built %s in %v\n", PropellerBinary(), d.Round(time.Second))
		}
	})
	if propellerBuild.err != nil {
		t.Fatal(propellerBuild.err)
	}
	return PropellerBinary()
}

// buildPropeller runs go build in the module's root under an exclusive
// lock on out.lock, with the test binaries' flags (testenv.RaceBuild): make test's
// go vet has compiled its packages.
func buildPropeller(ctx context.Context, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(out+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	cmd := testenv.RaceBuild(ctx, out, "./cmd/flytepropeller-kfelastic")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/flytepropeller-kfelastic: %w\n%s", err, stderr.String())
	}
	return nil
}

// PropellerOptions configure one flytepropeller.
type PropellerOptions struct {
	// Kubeconfig is the cluster propeller runs workflows on (its
	// propeller.kube-config); the plugin's own client gets it as $KUBECONFIG.
	Kubeconfig string
	// Store holds the workflows' metadata (s3://<bucket>/metadata) and raw
	// outputs (s3://<bucket>/raw).
	Store *testenv.MinIOServer
	// PodStoreEndpoint is the store's endpoint as the pods reach it (error
	// documents, flytekit's data); "" is Store's endpoint, right for
	// simulated pods on this machine.
	PodStoreEndpoint string
	// Namespace limits propeller to one namespace (limit-namespace); ""
	// watches all.
	Namespace string
	// AgentImage is plugins.kfelastic.agentImage; "" leaves the plugin's
	// default (the published image of its version).
	AgentImage string
	// DefaultPyTorch and DefaultTensorflow name the plugin that runs each
	// task type; "" is ours (kfelastic-pytorch, kfelastic-tensorflow).
	// "pytorch" and "tensorflow" are upstream's kubeflow plugins, linked
	// into the same binary, for comparisons.
	DefaultPyTorch, DefaultTensorflow string
	// LateDocumentGrace is plugins.kfelastic.lateDocumentGrace; 0: 5s.
	LateDocumentGrace time.Duration
}

// Propeller is a running flytepropeller.
type Propeller struct {
	// ConfigPath is its configuration file; EventsPath the file its events
	// go to (event.type: file: there is no flyteadmin).
	ConfigPath, EventsPath string
	// RawOutputPrefix is the default raw-data prefix (rawoutput-prefix).
	RawOutputPrefix string
	log             *tailWriter
	exited          chan struct{}
}

// Logs is the tail of propeller's output.
func (p *Propeller) Logs() string { return p.log.tail(64 << 10) }

// Events is the content of the events file so far.
func (p *Propeller) Events() string {
	b, _ := os.ReadFile(p.EventsPath)
	return string(b)
}

// propellerConfig is propeller's own configuration, as a platform engineer
// writes it for a cluster without flyteadmin:
//   - events go to a file (event.type: file), not to admin;
//   - launch plans (enable-admin-launcher: false: a launch-plan node fails
//     fast), the data catalog (catalog-cache.type: noop) and signals are
//     admin's, so nothing calls admin; its client is still built (lazily
//     dialled, never used) and points at a closed port so a call would fail
//     at once instead of reaching something;
//   - the FlyteWorkflow CRD is created by propeller at start;
//   - the k8s plugins a workflow needs around ours are enabled (container,
//     sidecar, k8s-array), the training task types go to kfelastic.
var propellerConfig = template.Must(template.New("propeller").Funcs(template.FuncMap{"q": strconv.Quote}).Parse(`propeller:
  kube-config: {{q .Kubeconfig}}
  create-flyteworkflow-crd: true
  limit-namespace: {{q .Namespace}}
  workers: 4
  workflow-reeval-duration: 2s
  downstream-eval-duration: 2s
  max-streak-length: 8
  metadata-prefix: metadata
  rawoutput-prefix: {{q .RawOutputPrefix}}
  enable-admin-launcher: false
  publish-k8s-events: true
  prof-port: {{.ProfPort}}
  leader-election:
    enabled: false
  queue:
    type: batch
    batching-interval: 200ms
    batch-size: -1
    queue:
      type: maxof
      base-delay: 0s
      max-delay: 5s
      rate: 1000
      capacity: 10000
    sub-queue:
      type: bucket
      rate: 1000
      capacity: 10000
  node-config:
    max-node-retries-system-failures: 3
event:
  type: file
  file-path: {{q .EventsPath}}
  rate: 500
  capacity: 1000
admin:
  endpoint: dns:///127.0.0.1:1
  insecure: true
catalog-cache:
  type: noop
storage:
  type: stow
  container: {{q .Bucket}}
  stow:
    kind: s3
    config:
      auth_type: accesskey
      access_key_id: {{q .AccessKey}}
      secret_key: {{q .SecretKey}}
      region: {{q .Region}}
      endpoint: {{q .Endpoint}}
      disable_ssl: "true"
  limits:
    maxDownloadMBs: 10
tasks:
  task-plugins:
    enabled-plugins:
      - container
      - sidecar
      - k8s-array
      - kfelastic-pytorch
      - kfelastic-tensorflow
{{- if or (eq .DefaultPyTorch "pytorch") (eq .DefaultTensorflow "tensorflow")}}
      - pytorch
      - tensorflow
{{- end}}
    default-for-task-types:
      container: container
      sidecar: sidecar
      container_array: k8s-array
      pytorch: {{q .DefaultPyTorch}}
      tensorflow: {{q .DefaultTensorflow}}
plugins:
  k8s:
    inject-finalizer: true
    default-cpus: 100m
    default-memory: 128Mi
    # A list of one-key maps, as Flyte's own deployments write it: viper
    # lowercases the keys of a plain map (aws_access_key_id), which no
    # AWS client then reads.
    default-env-vars:
      - AWS_ACCESS_KEY_ID: {{q .AccessKey}}
      - AWS_SECRET_ACCESS_KEY: {{q .SecretKey}}
      - AWS_REGION: {{q .Region}}
      - AWS_EC2_METADATA_DISABLED: "true"
      - FLYTE_AWS_ENDPOINT: {{q .PodEndpoint}}
      - FLYTE_AWS_ACCESS_KEY_ID: {{q .AccessKey}}
      - FLYTE_AWS_SECRET_ACCESS_KEY: {{q .SecretKey}}
  kfelastic:
{{- if .AgentImage}}
    agentImage: {{q .AgentImage}}
{{- end}}
    errorPrefixQuery: {{q .ErrorPrefixQuery}}
    lateDocumentGrace: {{q .LateDocumentGrace}}
  logs:
    kubernetes-enabled: true
    kubernetes-url: "http://localhost:30082"
logger:
  level: 4
  show-source: true
  formatter:
    type: text
`))

// WritePropellerConfig writes propeller's configuration for opts
// (propellerConfig) into dir, propeller.yaml, and returns the Propeller it
// describes, not started: the lead's cluster tests and `config validate`
// use it as StartPropeller does.
func WritePropellerConfig(opts PropellerOptions, dir string) (*Propeller, error) {
	if opts.Store == nil || opts.Kubeconfig == "" {
		return nil, fmt.Errorf("propeller config: Kubeconfig and Store are required")
	}
	port, err := testenv.FreePortNumber()
	if err != nil {
		return nil, err
	}
	p := &Propeller{
		ConfigPath:      filepath.Join(dir, "propeller.yaml"),
		EventsPath:      filepath.Join(dir, "events.txt"),
		RawOutputPrefix: "s3://" + opts.Store.Bucket + "/raw",
		log:             &tailWriter{max: 1 << 20},
		exited:          make(chan struct{}),
	}
	podEndpoint := orDefault(opts.PodStoreEndpoint, opts.Store.Endpoint)
	query := url.Values{}
	query.Set("endpoint", podEndpoint)
	query.Set("region", opts.Store.Region)
	query.Set("use_path_style", "true")
	query.Set("disable_https", "true")
	grace := opts.LateDocumentGrace
	if grace == 0 {
		grace = 5 * time.Second
	}
	values := map[string]any{
		"Kubeconfig": opts.Kubeconfig, "Namespace": orDefault(opts.Namespace, "all"),
		"RawOutputPrefix": p.RawOutputPrefix, "ProfPort": port, "EventsPath": p.EventsPath,
		"Bucket": opts.Store.Bucket, "AccessKey": opts.Store.AccessKey, "SecretKey": opts.Store.SecretKey,
		"Region": opts.Store.Region, "Endpoint": opts.Store.Endpoint, "PodEndpoint": podEndpoint,
		"DefaultPyTorch":    orDefault(opts.DefaultPyTorch, "kfelastic-pytorch"),
		"DefaultTensorflow": orDefault(opts.DefaultTensorflow, "kfelastic-tensorflow"),
		"AgentImage":        opts.AgentImage, "ErrorPrefixQuery": query.Encode(), "LateDocumentGrace": grace.String(),
	}
	var cfg bytes.Buffer
	if err := propellerConfig.Execute(&cfg, values); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.ConfigPath, cfg.Bytes(), 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

// StartPropeller runs BuildPropeller's binary with the configuration of
// WritePropellerConfig for the test's duration, in its own process group
// (SIGTERM, then SIGKILL at cleanup). It returns once propeller is ready
// (waitReady: the FlyteWorkflow CRD served, its workers started); its
// config, the tail of its
// output and its events are logged if the test failed (all of them, also
// on success, with KFELASTIC_PROPELLER_LOGS=1). It skips under -short.
func StartPropeller(t testing.TB, opts PropellerOptions) *Propeller {
	t.Helper()
	bin := BuildPropeller(t)
	p, err := WritePropellerConfig(opts, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", p.ConfigPath)
	// The plugin's own client (the master's Secret and RBAC) reads
	// $KUBECONFIG when it is not in a pod.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+opts.Kubeconfig)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("flytepropeller: %v", err)
	}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
		}
		// All of it on request, the tails on a failure.
		all := os.Getenv("KFELASTIC_PROPELLER_LOGS") != ""
		if t.Failed() || all {
			n := 12000
			if all {
				n = 1 << 20
			}
			cfg, _ := os.ReadFile(p.ConfigPath)
			t.Logf("flytepropeller config %s:\n%s", p.ConfigPath, cfg)
			t.Logf("flytepropeller events:\n%s", tailOf(p.Events(), n))
			t.Logf("flytepropeller output:\n%s", p.log.tail(n))
		}
	})
	if err := p.waitReady(opts.Kubeconfig, 2*time.Minute); err != nil {
		t.Fatalf("flytepropeller: %v\n%s", err, p.log.tail(8000))
	}
	return p
}

// propellerReady is what propeller logs once its informer caches have
// synced and its workers take workflows (pkg/controller/workers.go).
const propellerReady = `msg="Started workers"`

// waitReady waits until the API server serves flyteworkflows.flyte.lyft.com,
// which propeller creates at start (create-flyteworkflow-crd), and until
// propeller says its workers run, so that a workflow created next is
// picked up at once (the time to the job does not include propeller's
// start, ≈2 s here); or until propeller exits.
func (p *Propeller) waitReady(kubeconfig string, limit time.Duration) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(limit)
	served := false
	for {
		if !served {
			var list *metav1.APIResourceList
			if list, err = dc.ServerResourcesForGroupVersion("flyte.lyft.com/v1alpha1"); err == nil {
				for _, r := range list.APIResources {
					served = served || r.Name == "flyteworkflows"
				}
			}
		}
		if served && strings.Contains(p.log.tail(1<<20), propellerReady) {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited before it was ready (FlyteWorkflow CRD served: %v)", served)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: FlyteWorkflow CRD served: %v (last error: %v), %s logged: %v",
				limit, served, err, propellerReady, strings.Contains(p.log.tail(1<<20), propellerReady))
		}
	}
}

// Exited is closed when the process has ended.
func (p *Propeller) Exited() <-chan struct{} { return p.exited }

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
