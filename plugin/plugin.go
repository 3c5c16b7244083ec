package plugin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	flyteerr "github.com/flyteorg/flyte/flyteplugins/go/tasks/errors"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/logs"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/io"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/k8s"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/tasklog"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/utils"
	propellerconfig "github.com/flyteorg/flyte/flytepropeller/pkg/controller/config"
	propellerutils "github.com/flyteorg/flyte/flytepropeller/pkg/utils"
	"github.com/flyteorg/flyte/flytestdlib/storage"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/kfoperator"
	"github.com/kfelastic/kfelastic/outputreader"
	"github.com/kfelastic/kfelastic/outputreader/flyteio"
)

// Plugin is the k8s.Plugin of one task type, "pytorch" or "tensorflow".
type Plugin struct {
	taskType string
	cfg      *Config // nil: the registered section, read at each call

	// kube lists a terminal job's pods and creates an elastic job's master
	// objects. The k8s.PluginContext of flyteplugins v1.16.8 offers no
	// client, so the registered plugin builds its own on first use, for the
	// cluster propeller creates the jobs in: propeller's own kube-config
	// and master (its data plane), else in-cluster credentials.
	kubeOnce sync.Once
	kube     client.Client
	kubeErr  error
	// propeller is propeller's config section (kube-config, master, client
	// limits); nil: the registered one.
	propeller func() *propellerconfig.Config

	now func() time.Time
	// logs configures log links; nil: propeller's logs section.
	logs *logs.LogConfig
}

// Compile-time checks: both plugins are flyteplugins k8s plugins.
var (
	_ k8s.Plugin = (*Plugin)(nil)
)

// New returns the plugin of taskType ("pytorch" or "tensorflow") with a
// fixed config and kube client (nil: built on first use as the registered
// plugin does). Tests and benchmarks use it; propeller gets the registered
// ones.
func New(taskType string, cfg *Config, kube client.Client) *Plugin {
	p := &Plugin{taskType: taskType, cfg: cfg, kube: kube, now: time.Now}
	if kube != nil {
		p.kubeOnce.Do(func() {})
	}
	return p
}

// WithClock replaces the clock GetTaskPhase reads once per call (the phase
// mapping itself is pure).
func (p *Plugin) WithClock(now func() time.Time) *Plugin { p.now = now; return p }

// WithLogConfig sets the log-link configuration instead of propeller's
// logs section.
func (p *Plugin) WithLogConfig(c *logs.LogConfig) *Plugin { p.logs = c; return p }

func (p *Plugin) config() *Config {
	if p.cfg != nil {
		return p.cfg
	}
	return GetConfig()
}

func (p *Plugin) client() (client.Client, error) {
	p.kubeOnce.Do(func() {
		get := p.propeller
		if get == nil {
			get = propellerconfig.GetConfig
		}
		var cfg *rest.Config
		if cfg, p.kubeErr = PropellerRESTConfig(get()); p.kubeErr != nil {
			return
		}
		p.kube, p.kubeErr = client.New(cfg, client.Options{Scheme: scheme.Scheme})
	})
	return p.kube, p.kubeErr
}

// PropellerRESTConfig is the cluster propeller creates its jobs in, found as
// propeller finds it (its utils.GetKubeConfig: the propeller section's
// kube-config and master, else in-cluster credentials, with its client's
// QPS, burst and timeout). A propeller without either cannot run; the
// plugin outside one (a benchmark, a tool) falls back to $KUBECONFIG.
func PropellerRESTConfig(pc *propellerconfig.Config) (*rest.Config, error) {
	_, cfg, err := propellerutils.GetKubeConfig(context.Background(), pc)
	if err == nil {
		return cfg, nil
	}
	if pc.KubeConfigPath != "" {
		return nil, fmt.Errorf("kfelastic plugin: propeller's kube-config %q: %w", pc.KubeConfigPath, err)
	}
	cfg, kerr := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	if kerr != nil {
		return nil, fmt.Errorf("kfelastic plugin: no kube credentials (propeller's kube-config, in-cluster, or $KUBECONFIG): %w", err)
	}
	return cfg, nil
}

// GetProperties: the plugin reads the error documents itself, so
// propeller's own aggregation stays at its default.
func (p *Plugin) GetProperties() k8s.PluginProperties { return k8s.PluginProperties{} }

// BuildIdentityResource is the empty job of the task type.
func (p *Plugin) BuildIdentityResource(context.Context, pluginsCore.TaskExecutionMetadata) (client.Object, error) {
	if p.taskType == kfoperator.TensorflowTaskType {
		return &kubeflowv1.TFJob{TypeMeta: metav1.TypeMeta{Kind: kubeflowv1.TFJobKind, APIVersion: kubeflowv1.SchemeGroupVersion.String()}}, nil
	}
	return &kubeflowv1.PyTorchJob{TypeMeta: metav1.TypeMeta{Kind: kubeflowv1.PyTorchJobKind, APIVersion: kubeflowv1.SchemeGroupVersion.String()}}, nil
}

// jobName is the name the plugin manager gives the object.
func jobName(meta pluginsCore.TaskExecutionMetadata) string {
	name := meta.GetTaskExecutionID().GetGeneratedName()
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		name = utils.ConvertToDNS1123SubdomainCompatibleString(name)
	}
	return name
}

// BuildResource builds the job. For an elastic PyTorch task it also creates
// the master's Secret, service account, Role and RoleBinding, owned like the
// job by the Flyte workflow, before the plugin manager creates the job.
func (p *Plugin) BuildResource(ctx context.Context, taskCtx pluginsCore.TaskExecutionContext) (client.Object, error) {
	job, opts, err := p.buildJob(ctx, taskCtx)
	if err != nil {
		return nil, err
	}
	if pj, ok := job.(*kubeflowv1.PyTorchJob); ok && kfoperator.IsElastic(pj) {
		if err := p.createMasterObjects(ctx, taskCtx, opts); err != nil {
			return nil, err
		}
	}
	return job, nil
}

// buildJob is BuildResource without side effects.
func (p *Plugin) buildJob(ctx context.Context, taskCtx pluginsCore.TaskExecutionContext) (client.Object, kfoperator.Options, error) {
	tmpl, err := taskCtx.TaskReader().Read(ctx)
	if err != nil {
		return nil, kfoperator.Options{}, flyteerr.Errorf(flyteerr.BadTaskSpecification, "unable to fetch task specification: %v", err)
	}
	cfg := p.config()
	opts, err := p.options(taskCtx, cfg)
	if err != nil {
		return nil, opts, err
	}
	pods := &flytePods{ctx: ctx, tCtx: taskCtx}
	if p.taskType == kfoperator.TensorflowTaskType {
		job, err := kfoperator.BuildTFJob(tmpl, pods, opts)
		if err != nil {
			return nil, opts, err
		}
		return job, opts, nil
	}
	job, err := kfoperator.BuildPyTorchJob(tmpl, pods, opts)
	if err != nil {
		return nil, opts, err
	}
	return job, opts, nil
}

func (p *Plugin) options(taskCtx pluginsCore.TaskExecutionContext, cfg *Config) (kfoperator.Options, error) {
	meta := taskCtx.TaskExecutionMetadata()
	opts := kfoperator.Options{
		Name:             jobName(meta),
		Namespace:        meta.GetNamespace(),
		AgentImage:       cfg.AgentImage,
		RDZVBackend:      cfg.RDZVBackend,
		NetworkCheck:     cfg.NetworkCheck,
		ExcludeStraggler: cfg.ExcludeStraggler,
		HangTimeoutSec:   int(cfg.HangTimeout.Duration / time.Second),
		OOMMaxIncrement:  cfg.OOMMaxIncrement,
		OOMMaxMemory:     cfg.OOMMaxMemory,
		MaxRelaunches:    cfg.MaxRelaunches,
		TaintFailedNodes: cfg.TaintFailedNodes,
	}
	if cfg.OOMFactor != "" {
		f, err := strconv.ParseFloat(cfg.OOMFactor, 64)
		if err != nil || f < 1 {
			return opts, fmt.Errorf("plugins.kfelastic.oomFactor %q: want a number ≥ 1", cfg.OOMFactor)
		}
		opts.OOMFactor = f
	}
	for key, q := range map[string]string{"oomMaxIncrement": cfg.OOMMaxIncrement, "oomMaxMemory": cfg.OOMMaxMemory} {
		if q == "" {
			continue
		}
		if _, err := resource.ParseQuantity(q); err != nil {
			return opts, fmt.Errorf("plugins.kfelastic.%s %q: %w", key, q, err)
		}
	}
	prefix, err := ErrorPrefixURL(taskCtx.OutputWriter().GetOutputPrefixPath(), cfg.ErrorPrefixQuery)
	if err != nil {
		return opts, err
	}
	opts.ErrorPrefix = prefix
	return opts, nil
}

func (p *Plugin) createMasterObjects(ctx context.Context, taskCtx pluginsCore.TaskExecutionContext, opts kfoperator.Options) error {
	kube, err := p.client()
	if err != nil {
		return err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return fmt.Errorf("job token: %w", err)
	}
	owner := taskCtx.TaskExecutionMetadata().GetOwnerReference()
	var ownerRef *metav1.OwnerReference
	if owner.Name != "" && owner.UID != "" {
		ownerRef = &owner
	}
	for _, o := range kfoperator.MasterObjects(opts.Name, opts.Namespace, hex.EncodeToString(raw[:]), ownerRef, taskCtx.TaskExecutionMetadata().GetLabels()) {
		// A retried BuildResource finds them; the first token stands.
		if err := kube.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %T %s/%s for the kfelastic master: %w", o, o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}

// GetTaskPhase maps the job's status to a phase; when the job is terminal
// it lists its pods and reads the task's error documents first, so that the
// root cause decides (kfoperator.Phase). It reads the clock once.
func (p *Plugin) GetTaskPhase(ctx context.Context, pluginContext k8s.PluginContext, resource client.Object) (pluginsCore.PhaseInfo, error) {
	now := p.now()
	job, err := kfoperator.JobOf(resource)
	if err != nil {
		return pluginsCore.PhaseInfoUndefined, err
	}
	cfg := p.config()
	tmpl, err := pluginContext.TaskReader().Read(ctx)
	if err != nil {
		return pluginsCore.PhaseInfoUndefined, err
	}
	logCfg := p.logs
	if logCfg == nil {
		logCfg = logs.GetLogConfig()
	}
	taskLogs, err := taskLogs(pluginContext, logCfg, job, tmpl, now)
	if err != nil {
		return pluginsCore.PhaseInfoUndefined, err
	}
	statusDetails, _ := utils.MarshalObjToStruct(job.Status)
	info := pluginsCore.TaskInfo{Logs: taskLogs, CustomInfo: statusDetails}

	var (
		pods   []corev1.Pod
		report *outputreader.Summary
	)
	var ow io.OutputWriter
	if _, terminal := job.Terminal(); terminal {
		// Asking for the OutputWriter makes propeller buffer our outputs;
		// only a terminal job has any.
		ow = pluginContext.OutputWriter()
		pods = p.listPods(ctx, job, cfg)
		// ReadTimeout bounds the whole read here, and each storage call
		// (readOptions): a store that never answers fails this call, and
		// propeller calls again.
		readCtx, cancel := context.WithCancel(ctx)
		if cfg.ReadTimeout.Duration > 0 {
			readCtx, cancel = context.WithTimeout(ctx, cfg.ReadTimeout.Duration)
		}
		src := flyteio.NewDataStoreSource(pluginContext.DataStore(), ow.GetOutputPrefixPath())
		// Summarize, not Read: the plugin needs the root cause and the tally,
		// and its memory must not grow with the number of documents.
		report, err = outputreader.Summarize(readCtx, src, readOptions(cfg))
		cancel()
		if err != nil {
			// Transient (storage): propeller calls again.
			return pluginsCore.PhaseInfoUndefined, fmt.Errorf("read error documents under %s: %w", ow.GetOutputPrefixPath(), err)
		}
	}
	phase, err := kfoperator.Phase(job, pods, report, now, kfoperator.PhaseConfig{
		LateDocumentGrace: cfg.LateDocumentGrace.Duration,
		OperatorTimeout:   cfg.OperatorTimeout.Duration,
	}, info)
	if err != nil {
		return phase, err
	}
	if phase.Phase() == pluginsCore.PhaseSuccess && ow != nil {
		if reason, ok := recoveredReason(ctx, pluginContext.DataStore(), ow.GetOutputPrefixPath(), cfg); ok && phase.Info() != nil {
			phase.Info().AdditionalReasons = append(phase.Info().AdditionalReasons, pluginsCore.ReasonInfo{Reason: reason, OccurredAt: &now})
		}
		// Hand propeller the reader (outputs as upstream, errors as ours).
		r, err := flyteio.NewOutputReader(ctx, pluginContext.DataStore(), ow, 0, readOptions(cfg))
		if err != nil {
			return pluginsCore.PhaseInfoUndefined, err
		}
		if err := ow.Put(ctx, r); err != nil {
			return pluginsCore.PhaseInfoUndefined, err
		}
	}
	if err := k8s.MaybeUpdatePhaseVersionFromPluginContext(&phase, &pluginContext); err != nil {
		return phase, err
	}
	return phase, nil
}

// recoveredReason says, for a job that succeeded, what it recovered from:
// the root cause among the documents moved to superseded/ (an agent's
// restart, a replaced pod, a pod the job went on without), with how many
// there were; the success event carries it, so that a GPU that fell off
// the bus on the way is not only in the pods' logs. false when there were
// none, or they cannot be read now (the success stands).
func recoveredReason(ctx context.Context, store *storage.DataStore, prefix storage.DataReference, cfg *Config) (string, bool) {
	if cfg.ReadTimeout.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.ReadTimeout.Duration)
		defer cancel()
	}
	dir := strings.TrimRight(string(prefix), "/") + "/" + strings.TrimSuffix(kferrors.SupersededPrefix, "/")
	report, err := outputreader.Summarize(ctx, flyteio.NewDataStoreSource(store, storage.DataReference(dir)), readOptions(cfg))
	if err != nil {
		slog.WarnContext(ctx, "cannot read the recovered failures", "prefix", dir, "err", err)
		return "", false
	}
	if report.RootCause == nil {
		return "", false
	}
	reason := fmt.Sprintf("recovered from %s of %s (%s): the first:\n%s", outputreader.Plural(report.Documents(), "failure", "failures"),
		outputreader.Plural(report.Pods(), "pod", "pods"), kferrors.SupersededPrefix, report.Message())
	slog.InfoContext(ctx, "the job succeeded after recovering from failures", "prefix", string(prefix), "reason", reason)
	return reason, true
}

// readOptions are the reader's options from the config; CallTimeout bounds
// each storage call, of GetTaskPhase and of the OutputReader handed to
// propeller alike.
func readOptions(cfg *Config) *outputreader.Options {
	return &outputreader.Options{Concurrency: cfg.ReadConcurrency, MessageCap: cfg.MessageCap, MaxDocumentBytes: cfg.MaxDocumentBytes,
		CallTimeout: cfg.ReadTimeout.Duration}
}

// listPods returns the job's pods, or nil when they cannot be listed (the
// failed-pod count then comes from the job status and no documents are
// synthesized).
func (p *Plugin) listPods(ctx context.Context, job kfoperator.Job, cfg *Config) []corev1.Pod {
	if !cfg.ListPods {
		return nil
	}
	kube, err := p.client()
	if err != nil {
		slog.WarnContext(ctx, "cannot list pods", "job", job.Meta.Name, "err", err)
		return nil
	}
	if cfg.ReadTimeout.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.ReadTimeout.Duration)
		defer cancel()
	}
	var list corev1.PodList
	if err := kube.List(ctx, &list, client.InNamespace(job.Meta.Namespace),
		client.MatchingLabels{kubeflowv1.JobNameLabel: job.Meta.Name}); err != nil {
		slog.WarnContext(ctx, "cannot list pods", "job", job.Meta.Name, "err", err)
		return nil
	}
	if list.Items == nil {
		list.Items = []corev1.Pod{}
	}
	return list.Items
}

// taskLogs links every pod the job has, named as the operator names them.
func taskLogs(pc k8s.PluginContext, cfg *logs.LogConfig, job kfoperator.Job, tmpl *core.TaskTemplate, now time.Time) ([]*core.TaskLog, error) {
	logPlugin, err := logs.InitializeLogPlugins(cfg)
	if err != nil || logPlugin == nil {
		return nil, err
	}
	start := job.Meta.CreationTimestamp.Time
	container := kubeflowv1.PyTorchJobDefaultContainerName
	if job.Kind == kubeflowv1.TFJobKind {
		container = kubeflowv1.TFJobDefaultContainerName
	}
	var out []*core.TaskLog
	for _, pod := range job.LogPods() {
		o, err := logPlugin.GetTaskLogs(tasklog.Input{
			PodName:              pod.Name,
			Namespace:            job.Meta.Namespace,
			LogName:              fmt.Sprintf("%s-%d", pod.Replica, pod.Index),
			PodRFC3339StartTime:  start.Format(time.RFC3339),
			PodRFC3339FinishTime: now.Format(time.RFC3339),
			PodUnixStartTime:     start.Unix(),
			PodUnixFinishTime:    now.Unix(),
			TaskExecutionID:      pc.TaskExecutionMetadata().GetTaskExecutionID(),
			TaskTemplate:         tmpl,
			ContainerName:        container,
		})
		if err != nil {
			return nil, err
		}
		out = append(out, o.TaskLogs...)
	}
	return out, nil
}

func init() {
	if err := kubeflowv1.AddToScheme(scheme.Scheme); err != nil {
		panic(err)
	}
	for _, tt := range []string{kfoperator.PyTorchTaskType, kfoperator.TensorflowTaskType} {
		var watch client.Object = &kubeflowv1.PyTorchJob{}
		if tt == kfoperator.TensorflowTaskType {
			watch = &kubeflowv1.TFJob{}
		}
		pluginmachinery.PluginRegistry().RegisterK8sPlugin(k8s.PluginEntry{
			ID:                  "kfelastic-" + tt,
			RegisteredTaskTypes: []pluginsCore.TaskType{tt},
			ResourceToWatch:     watch,
			Plugin:              &Plugin{taskType: tt, now: time.Now},
		})
	}
}
