package kubeenv_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flytepropeller/pkg/apis/flyteworkflow/v1alpha1"
	"google.golang.org/protobuf/proto"

	"github.com/kfelastic/kfelastic/internal/test/flytetest"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
)

// TestTaskWorkflowOfEveryTemplate: propeller's compiler accepts the
// one-node workflow of every valid task template, and the FlyteWorkflow
// carries the task, the execution id and the raw-output prefix, and
// survives the JSON round trip the API server puts it through.
func TestTaskWorkflowOfEveryTemplate(t *testing.T) {
	for _, name := range flytetest.TemplateNames(t, "") {
		if strings.HasPrefix(name, "bad-") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			tmpl := flytetest.LoadTemplate(t, name)
			orig := proto.Clone(tmpl)
			fw, err := kubeenv.TaskWorkflow(tmpl, kubeenv.WorkflowOptions{Namespace: "ns", Name: "exec-1", RawOutputPrefix: "s3://b/raw"})
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(tmpl, orig) {
				t.Errorf("the template was modified: %v", tmpl.GetId())
			}
			data, err := json.Marshal(fw)
			if err != nil {
				t.Fatal(err)
			}
			var back v1alpha1.FlyteWorkflow
			if err := json.Unmarshal(data, &back); err != nil {
				t.Fatal(err)
			}
			if back.Name != "exec-1" || back.Namespace != "ns" || back.ExecutionID.GetName() != "exec-1" ||
				back.RawOutputDataConfig.GetOutputLocationPrefix() != "s3://b/raw" || back.AcceptedAt == nil {
				t.Errorf("metadata: %s/%s exec %v raw %q accepted %v", back.Namespace, back.Name, back.ExecutionID.WorkflowExecutionIdentifier,
					back.RawOutputDataConfig.GetOutputLocationPrefix(), back.AcceptedAt)
			}
			node, ok := back.Nodes[kubeenv.TaskNodeID]
			if !ok || node.TaskRef == nil {
				t.Fatalf("no task node %s: %v", kubeenv.TaskNodeID, back.Nodes)
			}
			task, ok := back.Tasks[*node.TaskRef]
			if !ok || task.Type != tmpl.GetType() {
				t.Fatalf("node's task %q of type %q, want %q (tasks %v)", *node.TaskRef, task.Type, tmpl.GetType(), back.Tasks)
			}
		})
	}
}

// TestTaskWorkflowInputs: a task's inputs become the workflow's, bound to
// the node; the execution must give them.
func TestTaskWorkflowInputs(t *testing.T) {
	tmpl := flytetest.LoadTemplate(t, "pytorch-v1-elastic-3-4")
	tmpl.Interface = &core.TypedInterface{Inputs: &core.VariableMap{Variables: map[string]*core.Variable{
		"epochs": {Type: &core.LiteralType{Type: &core.LiteralType_Simple{Simple: core.SimpleType_INTEGER}}},
	}}}
	if _, err := kubeenv.TaskWorkflow(tmpl, kubeenv.WorkflowOptions{Namespace: "ns"}); err == nil {
		t.Error("a task with an input built without it")
	}
	epochs := &core.Literal{Value: &core.Literal_Scalar{Scalar: &core.Scalar{Value: &core.Scalar_Primitive{
		Primitive: &core.Primitive{Value: &core.Primitive_Integer{Integer: 3}}}}}}
	fw, err := kubeenv.TaskWorkflow(tmpl, kubeenv.WorkflowOptions{Namespace: "ns",
		Inputs: &core.LiteralMap{Literals: map[string]*core.Literal{"epochs": epochs}}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(fw.Name, "e2e-") || fw.Inputs.GetLiterals()["epochs"] == nil {
		t.Errorf("name %q, inputs %v", fw.Name, fw.Inputs)
	}
	if in := fw.Nodes[kubeenv.TaskNodeID].InputBindings; len(in) != 1 || in[0].GetVar() != "epochs" {
		t.Errorf("node bindings %v", in)
	}
}
