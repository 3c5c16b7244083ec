package kubeenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/admin"
	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	"github.com/flyteorg/flyte/flytepropeller/pkg/apis/flyteworkflow/v1alpha1"
	"github.com/flyteorg/flyte/flytepropeller/pkg/compiler"
	"github.com/flyteorg/flyte/flytepropeller/pkg/compiler/transformers/k8s"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FlyteScheme is Scheme with propeller's FlyteWorkflow.
func FlyteScheme() *runtime.Scheme {
	s := Scheme()
	_ = v1alpha1.AddToScheme(s)
	return s
}

// TaskNodeID is the one node of a workflow built by TaskWorkflow.
const TaskNodeID = "n0"

// WorkflowOptions are what flyteadmin would decide for an execution.
type WorkflowOptions struct {
	// Namespace the FlyteWorkflow (and so the task's job) is created in.
	Namespace string
	// Name is the execution's name; "" is a random "e2e-<hex>".
	Name string
	// Project and Domain of the execution; "" is "kfelastic" and "development".
	Project, Domain string
	// Inputs of the task, bound to the workflow's inputs of the same names;
	// nil is none (a task with inputs then fails to build).
	Inputs *core.LiteralMap
	// RawOutputPrefix is the execution's raw-data prefix; "" leaves
	// propeller's rawoutput-prefix.
	RawOutputPrefix string
	// ServiceAccount the task's pods run as; "" is the namespace's default.
	ServiceAccount string
	// AcceptedAt is when the execution was accepted; zero is now.
	AcceptedAt time.Time
}

// TaskWorkflow is what flyteadmin makes of a one-task workflow execution:
// a workflow whose single node (TaskNodeID) runs tmpl with the workflow's
// inputs, compiled by propeller's compiler (CompileTask, CompileWorkflow)
// and turned into a FlyteWorkflow by its k8s transformer
// (BuildFlyteWorkflow), with the execution id, raw-output prefix, service
// account and acceptance time set as admin sets them. It is ready to Create.
// tmpl is not modified: an id without resource type, project, domain or
// version (the templates in testdata/tasks) is completed.
func TaskWorkflow(tmpl *core.TaskTemplate, opts WorkflowOptions) (*v1alpha1.FlyteWorkflow, error) {
	project, domain := orDefault(opts.Project, "kfelastic"), orDefault(opts.Domain, "development")
	name := opts.Name
	if name == "" {
		var r [5]byte
		_, _ = rand.Read(r[:])
		name = "e2e-" + hex.EncodeToString(r[:])
	}
	task := proto.Clone(tmpl).(*core.TaskTemplate)
	id := task.GetId()
	if id == nil {
		return nil, fmt.Errorf("task template without an id")
	}
	id.ResourceType = core.ResourceType_TASK
	id.Project, id.Domain = orDefault(id.GetProject(), project), orDefault(id.GetDomain(), domain)
	id.Version = orDefault(id.GetVersion(), "v1")
	if task.GetInterface() == nil {
		task.Interface = &core.TypedInterface{}
	}
	if task.Interface.Inputs == nil {
		task.Interface.Inputs = &core.VariableMap{Variables: map[string]*core.Variable{}}
	}
	if task.Interface.Outputs == nil {
		task.Interface.Outputs = &core.VariableMap{Variables: map[string]*core.Variable{}}
	}

	// The workflow's inputs are the task's; the node binds each to the
	// workflow input of the same name.
	var bindings []*core.Binding
	for v := range task.GetInterface().GetInputs().GetVariables() {
		bindings = append(bindings, &core.Binding{Var: v, Binding: &core.BindingData{
			Value: &core.BindingData_Promise{Promise: &core.OutputReference{NodeId: "start-node", Var: v}}}})
	}
	wf := &core.WorkflowTemplate{
		Id: &core.Identifier{ResourceType: core.ResourceType_WORKFLOW, Project: id.GetProject(), Domain: id.GetDomain(),
			Name: id.GetName() + "-wf", Version: id.GetVersion()},
		Interface: &core.TypedInterface{Inputs: task.GetInterface().GetInputs(),
			Outputs: &core.VariableMap{Variables: map[string]*core.Variable{}}},
		Nodes: []*core.Node{{
			Id:       TaskNodeID,
			Metadata: &core.NodeMetadata{Name: id.GetName()},
			Inputs:   bindings,
			Target:   &core.Node_TaskNode{TaskNode: &core.TaskNode{Reference: &core.TaskNode_ReferenceId{ReferenceId: id}}},
		}},
	}
	compiledTask, err := compiler.CompileTask(task)
	if err != nil {
		return nil, fmt.Errorf("compile task %s: %w", id.GetName(), err)
	}
	closure, err := compiler.CompileWorkflow(wf, nil, []*core.CompiledTask{compiledTask}, nil)
	if err != nil {
		return nil, fmt.Errorf("compile workflow of %s: %w", id.GetName(), err)
	}
	inputs := opts.Inputs
	if inputs == nil {
		inputs = &core.LiteralMap{Literals: map[string]*core.Literal{}}
	}
	execID := &core.WorkflowExecutionIdentifier{Project: project, Domain: domain, Name: name}
	fw, err := k8s.BuildFlyteWorkflow(closure, inputs, execID, opts.Namespace)
	if err != nil {
		return nil, fmt.Errorf("build FlyteWorkflow of %s: %w", id.GetName(), err)
	}
	accepted := opts.AcceptedAt
	if accepted.IsZero() {
		accepted = time.Now()
	}
	fw.ExecutionID = v1alpha1.WorkflowExecutionIdentifier{WorkflowExecutionIdentifier: execID}
	fw.AcceptedAt = &metav1.Time{Time: accepted}
	fw.WorkflowMeta = &v1alpha1.WorkflowMeta{EventVersion: v1alpha1.EventVersion2}
	fw.ServiceAccountName = opts.ServiceAccount
	fw.SecurityContext = core.SecurityContext{RunAs: &core.Identity{K8SServiceAccount: opts.ServiceAccount}}
	if opts.RawOutputPrefix != "" {
		fw.RawOutputDataConfig = v1alpha1.RawOutputDataConfig{RawOutputDataConfig: &admin.RawOutputDataConfig{OutputLocationPrefix: opts.RawOutputPrefix}}
	}
	return fw, nil
}

// WorkflowOutcome is what the Flyte UI shows of a one-task execution: the
// workflow's phase and message, the task node's phase, attempts and error.
type WorkflowOutcome struct {
	Phase   v1alpha1.WorkflowPhase
	Message string
	// NodePhase is the task node's phase: NodePhaseNotYetStarted until
	// propeller has started it.
	NodePhase v1alpha1.NodePhase
	// TaskPhase is the phase of the node's task execution, the one the UI
	// shows beside the node (QUEUED, INITIALIZING, RUNNING, …): a node is
	// Running as soon as its task is handed to the plugin, the task only
	// once the plugin says so. PhaseUndefined until then.
	TaskPhase pluginsCore.Phase
	// NodeMessage is the node's status message; NodeError its error (nil
	// unless failing or failed): code, message, kind (USER or SYSTEM).
	NodeMessage string
	NodeError   *core.ExecutionError
	// Attempts counts the node's attempts (retries) so far.
	Attempts uint32
}

// Terminal: the workflow succeeded, failed or was aborted.
func (o WorkflowOutcome) Terminal() bool { return v1alpha1.IsWorkflowPhaseTerminal(o.Phase) }

// String is the outcome in one line, for test logs.
func (o WorkflowOutcome) String() string {
	s := fmt.Sprintf("workflow %s, node %s", o.Phase, o.NodePhase)
	if o.TaskPhase != pluginsCore.PhaseUndefined {
		s += ", task " + o.TaskPhase.String()
	}
	if o.Attempts > 0 {
		s += fmt.Sprintf(" (attempts %d)", o.Attempts)
	}
	if o.NodeError != nil {
		s += fmt.Sprintf(", error %s %s: %q", o.NodeError.GetKind(), o.NodeError.GetCode(), o.NodeError.GetMessage())
	} else if o.NodeMessage != "" {
		s += fmt.Sprintf(": %q", o.NodeMessage)
	}
	return s
}

// Outcome reads the outcome of the workflow of key from its status, node
// TaskNodeID. c must know FlyteScheme's types.
func Outcome(ctx context.Context, c client.Client, key client.ObjectKey) (WorkflowOutcome, error) {
	var fw v1alpha1.FlyteWorkflow
	if err := c.Get(ctx, key, &fw); err != nil {
		return WorkflowOutcome{}, err
	}
	o := WorkflowOutcome{Phase: fw.Status.Phase, Message: fw.Status.Message}
	if n := fw.Status.NodeStatus[TaskNodeID]; n != nil {
		o.NodePhase, o.NodeMessage, o.Attempts = n.Phase, n.Message, n.Attempts
		if n.Error != nil {
			o.NodeError = n.Error.ExecutionError
		}
		if n.TaskNodeStatus != nil {
			o.TaskPhase = pluginsCore.Phase(n.TaskNodeStatus.Phase)
		}
	}
	return o, nil
}

// WaitOutcome polls Outcome every 200 ms until done accepts it, and
// returns it; on ctx's end it returns the last outcome read with the error.
func WaitOutcome(ctx context.Context, c client.Client, key client.ObjectKey, done func(WorkflowOutcome) bool) (WorkflowOutcome, error) {
	var last WorkflowOutcome
	for {
		o, err := Outcome(ctx, c, key)
		if err == nil {
			last = o
			if done(o) {
				return o, nil
			}
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("waiting for workflow %s: %w (last: %v, read error: %v)", key, ctx.Err(), last, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
