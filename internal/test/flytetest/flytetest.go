// Package flytetest gives tests and benchmarks a flyteplugins
// TaskExecutionContext for one task attempt: propeller builds the real one
// from a FlyteWorkflow object and admin's data, which cannot run here, so
// the context is assembled from plain values around real parts — a
// flytestdlib DataStore, upstream's remote-file input reader and output
// writer, and a plugin state that persists between calls as propeller's does.
package flytetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/catalog"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/io"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/ioutils"
	"github.com/flyteorg/flyte/flytestdlib/contextutils"
	"github.com/flyteorg/flyte/flytestdlib/promutils"
	"github.com/flyteorg/flyte/flytestdlib/promutils/labeled"
	"github.com/flyteorg/flyte/flytestdlib/storage"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Task describes one attempt of a task.
type Task struct {
	Template  *core.TaskTemplate
	Name      string // the generated name: the job's name
	Namespace string
	Labels    map[string]string
	Owner     metav1.OwnerReference
	// Prefix is the attempt's metadata prefix; outputs and error documents
	// go under Prefix (as propeller lays them out), inputs under Prefix/inputs.
	Prefix storage.DataReference
	Store  *storage.DataStore
	// Resources are what propeller's overrides carry (the task's resources
	// after platform defaults); nil: upstream tests' 100m–1 CPU, 512Mi–1Gi.
	Resources *corev1.ResourceRequirements
}

var defaultResources = corev1.ResourceRequirements{
	Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")},
	Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("512Mi")},
}

// Context is the TaskExecutionContext of t; the state it carries persists
// across calls on the same Context. It writes the (empty) inputs.
func (t Task) Context(ctx context.Context) *Context {
	if t.Resources == nil {
		t.Resources = defaultResources.DeepCopy()
	}
	_ = t.Store.WriteProtobuf(ctx, t.Prefix+"/inputs/inputs.pb", storage.Options{}, &core.LiteralMap{})
	paths := ioutils.NewCheckpointRemoteFilePaths(ctx, t.Store, t.Prefix, ioutils.NewRawOutputPaths(ctx, t.Prefix+"/raw"), "")
	in := ioutils.NewRemoteFileInputReader(ctx, t.Store, ioutils.NewInputFilePaths(ctx, t.Store, t.Prefix+"/inputs"))
	return &Context{
		task: t,
		in:   in,
		// As propeller gives plugins: Put keeps the reader, read later.
		out:   ioutils.NewBufferedOutputWriter(ctx, paths),
		state: &State{},
	}
}

// Context implements pluginsCore.TaskExecutionContext.
type Context struct {
	task  Task
	in    io.InputReader
	out   io.OutputWriter
	state *State
}

var _ pluginsCore.TaskExecutionContext = (*Context)(nil)

func (c *Context) ResourceManager() pluginsCore.ResourceManager     { return nil }
func (c *Context) SecretManager() pluginsCore.SecretManager         { return nil }
func (c *Context) TaskRefreshIndicator() pluginsCore.SignalAsync    { return func(context.Context) {} }
func (c *Context) DataStore() *storage.DataStore                    { return c.task.Store }
func (c *Context) PluginStateReader() pluginsCore.PluginStateReader { return c.state }
func (c *Context) PluginStateWriter() pluginsCore.PluginStateWriter { return c.state }
func (c *Context) TaskReader() pluginsCore.TaskReader               { return taskReader{c.task} }
func (c *Context) InputReader() io.InputReader                      { return c.in }
func (c *Context) TaskExecutionMetadata() pluginsCore.TaskExecutionMetadata {
	return metadata{c.task}
}
func (c *Context) OutputWriter() io.OutputWriter              { return c.out }
func (c *Context) Catalog() catalog.AsyncClient               { return nil }
func (c *Context) EventsRecorder() pluginsCore.EventsRecorder { return nil }

type taskReader struct{ t Task }

func (r taskReader) Path(context.Context) (storage.DataReference, error) {
	return r.t.Prefix + "/task.pb", nil
}
func (r taskReader) Read(context.Context) (*core.TaskTemplate, error) {
	if r.t.Template == nil {
		return nil, fmt.Errorf("no task template")
	}
	return r.t.Template, nil
}

type metadata struct{ t Task }

func (m metadata) GetOwnerID() types.NamespacedName {
	return types.NamespacedName{Namespace: m.t.Namespace, Name: m.t.Owner.Name}
}
func (m metadata) GetTaskExecutionID() pluginsCore.TaskExecutionID { return execID{m.t} }
func (m metadata) GetNamespace() string                            { return m.t.Namespace }
func (m metadata) GetOwnerReference() metav1.OwnerReference        { return m.t.Owner }
func (m metadata) GetOverrides() pluginsCore.TaskOverrides         { return overrides{m.t.Resources} }
func (m metadata) GetLabels() map[string]string                    { return m.t.Labels }
func (m metadata) GetMaxAttempts() uint32                          { return 3 }
func (m metadata) GetAnnotations() map[string]string {
	return map[string]string{"flyte.org/test": "yes"}
}
func (m metadata) GetK8sServiceAccount() string             { return "default" }
func (m metadata) GetSecurityContext() core.SecurityContext { return core.SecurityContext{} }
func (m metadata) IsInterruptible() bool                    { return false }
func (m metadata) GetPlatformResources() *corev1.ResourceRequirements {
	return &corev1.ResourceRequirements{}
}
func (m metadata) GetInterruptibleFailureThreshold() int32    { return 0 }
func (m metadata) GetEnvironmentVariables() map[string]string { return nil }
func (m metadata) GetConsoleURL() string                      { return "" }

type execID struct{ t Task }

func (e execID) GetGeneratedName() string { return e.t.Name }
func (e execID) GetGeneratedNameWith(minLength, maxLength int) (string, error) {
	return e.t.Name, nil
}
func (e execID) GetID() core.TaskExecutionIdentifier {
	return core.TaskExecutionIdentifier{
		TaskId: &core.Identifier{ResourceType: core.ResourceType_TASK, Project: "p", Domain: "d", Name: e.t.Name},
		NodeExecutionId: &core.NodeExecutionIdentifier{NodeId: "n0", ExecutionId: &core.WorkflowExecutionIdentifier{
			Project: "p", Domain: "d", Name: e.t.Name,
		}},
	}
}
func (e execID) GetUniqueNodeID() string { return "n0" }

type overrides struct{ res *corev1.ResourceRequirements }

func (o overrides) GetResources() *corev1.ResourceRequirements  { return o.res }
func (overrides) GetExtendedResources() *core.ExtendedResources { return nil }
func (overrides) GetContainerImage() string                     { return "" }
func (overrides) GetPodTemplate() *core.K8SPod                  { return nil }
func (overrides) GetConfig() *corev1.ConfigMap                  { return nil }

// State is the plugin state propeller persists between rounds, kept here as
// JSON as propeller keeps it encoded.
type State struct {
	mu      sync.Mutex
	version uint8
	data    []byte
}

func (s *State) GetStateVersion() uint8 { s.mu.Lock(); defer s.mu.Unlock(); return s.version }
func (s *State) Get(v interface{}) (uint8, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.data == nil {
		return s.version, nil
	}
	return s.version, json.Unmarshal(s.data, v)
}
func (s *State) Put(version uint8, v interface{}) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.version, s.data = version, data
	return nil
}
func (s *State) Reset() error { s.mu.Lock(); defer s.mu.Unlock(); s.data = nil; return nil }

var metricKeys sync.Once

// SetMetricKeys sets flytestdlib's labeled-metric keys once per process, as
// propeller's main does; DataStores and plugin managers need them.
func SetMetricKeys() {
	metricKeys.Do(func() { labeled.SetMetricKeys(contextutils.AppNameKey) })
}

// MemoryStore is a flytestdlib DataStore in memory, for one test.
func MemoryStore() (*storage.DataStore, error) {
	SetMetricKeys()
	return storage.NewDataStore(&storage.Config{Type: storage.TypeMemory}, promutils.NewTestScope())
}
