package plugin

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteplugins/go/tasks/logs"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kfelastic/kfelastic/internal/test/flytetest"
)

// TestLogLinks: links point at the pods the operator creates, for every
// replica type, and the clock is the one given.
func TestLogLinks(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	logCfg := &logs.LogConfig{IsKubernetesEnabled: true, KubernetesTemplateURI: "http://k8s/{{ .namespace }}/{{ .podName }}"}
	for _, c := range []struct {
		template string
		job      func(tctx *flytetest.Context) client.Object
		want     string
	}{
		{"tensorflow-v1-ps", func(tctx *flytetest.Context) client.Object {
			o, _, err := New("tensorflow", testConfig(), nil).buildJob(ctx, tctx)
			if err != nil {
				t.Fatal(err)
			}
			return o
		}, "j-chief-0 j-worker-0 j-worker-1 j-ps-0"},
		{"upstream-pytorch-v1", func(tctx *flytetest.Context) client.Object {
			o, _, err := New("pytorch", testConfig(), nil).buildJob(ctx, tctx)
			if err != nil {
				t.Fatal(err)
			}
			j := o.(*kubeflowv1.PyTorchJob)
			two := int32(2)
			j.Spec.PyTorchReplicaSpecs["Worker"].Replicas = &two
			return j
		}, "j-master-0 j-worker-0 j-worker-1"},
	} {
		tmpl := flytetest.LoadTemplate(t, c.template)
		tctx := flytetest.Task{Template: tmpl, Name: "j", Namespace: "ns", Prefix: "s3://b/m", Store: memStore(t)}.Context(ctx)
		obj := c.job(tctx)
		obj.SetName("j")
		obj.SetNamespace("ns")
		running := kubeflowv1.JobStatus{StartTime: &metav1.Time{Time: now}, Conditions: []kubeflowv1.JobCondition{
			{Type: kubeflowv1.JobRunning, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(now)}}}
		switch j := obj.(type) {
		case *kubeflowv1.PyTorchJob:
			j.Status = running
		case *kubeflowv1.TFJob:
			j.Status = running
		}
		p := New(tmpl.GetType(), testConfig(), nil).WithLogConfig(logCfg).WithClock(func() time.Time { return now })
		info, err := p.GetTaskPhase(ctx, tctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		if info.Phase() != pluginsCore.PhaseRunning || !info.Info().OccurredAt.Equal(now) {
			t.Errorf("%s: %v at %v", c.template, info.Phase(), info.Info().OccurredAt)
		}
		var pods []string
		for _, l := range info.Info().Logs {
			pods = append(pods, strings.TrimPrefix(l.GetUri(), "http://k8s/ns/"))
		}
		if strings.Join(pods, " ") != c.want {
			t.Errorf("%s: log links to %v, want %s", c.template, pods, c.want)
		}
	}
}
