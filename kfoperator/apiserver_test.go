package kfoperator

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/kfelastic/kfelastic/internal/test/flytetest"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestAPIServerAcceptsEveryBuiltObject sends every job built from
// testdata/tasks (and the master's Secret, account, Role and binding) to a
// real kube-apiserver with the Kubeflow CRDs: server-side schema validation
// must accept them. Templates the builder refuses never reach it. flytekit's
// Elastic templates are built as with the default configuration (no agent
// image) and stored with the default image.
func TestAPIServerAcceptsEveryBuiltObject(t *testing.T) {
	cfg := kubeenv.Kube(t)
	c, err := client.New(cfg, client.Options{Scheme: kubeenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A namespace of its own per run: the API server lives for the whole
	// test process, which may run this test more than once (-count).
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kfoperator-accept-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	i := 0
	defaults := false
	for name, w := range table {
		tmpl := flytetest.LoadTemplate(t, name)
		i++
		opts := optsFor(w)
		opts.Name = "job" + itoa(int32(i))
		opts.Namespace = ns.Name
		var (
			obj client.Object
			err error
		)
		if tmpl.GetType() == TensorflowTaskType {
			obj, err = BuildTFJob(tmpl, fixedPods{tmpl}, opts)
		} else {
			obj, err = BuildPyTorchJob(tmpl, fixedPods{tmpl}, opts)
		}
		if w.err != "" {
			if err == nil {
				t.Errorf("%s: built", name)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if j, ok := obj.(*kubeflowv1.PyTorchJob); ok && IsElastic(j) {
			for _, o := range MasterObjects(opts.Name, ns.Name, "token-"+opts.Name, nil, nil) {
				if err := c.Create(ctx, o); err != nil {
					t.Errorf("%s: the API server refused %T %s: %v", name, o, o.GetName(), err)
				}
			}
		}
		if obj == nil {
			t.Fatalf("%s: nothing built", name)
		}
		obj.SetName(opts.Name)
		obj.SetNamespace(ns.Name)
		if err := c.Create(ctx, obj); err != nil {
			t.Errorf("%s: the API server refused the built %T: %v", name, obj, err)
			continue
		}
		// What was stored reads back with the replicas we asked for.
		back := obj.DeepCopyObject().(client.Object)
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), back); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		j, _ := JobOf(back)
		for rt, n := range w.replicas {
			if got := replicas(j.Replicas[rt]); got != n {
				t.Errorf("%s: stored %s replicas %d, want %d", name, rt, got, n)
			}
		}
		if w.defaultImage {
			// Built with no agent image: stored with the default one, in
			// the installer and the master.
			pj := back.(*kubeflowv1.PyTorchJob)
			inits := pj.Spec.PyTorchReplicaSpecs[W].Template.Spec.InitContainers
			master := pj.Spec.PyTorchReplicaSpecs[M].Template.Spec.Containers[0]
			if len(inits) != 1 || inits[0].Image != DefaultAgentImage() || master.Image != DefaultAgentImage() {
				t.Errorf("%s: stored installer %+v, master image %q; want %s", name, inits, master.Image, DefaultAgentImage())
			}
		}
		defaults = defaults || w.defaultImage
	}
	if !defaults {
		t.Error("no job of the table was built with the default agent image")
	}
}

// TestAPIServerValidates shows that the acceptance above means something:
// the same server refuses a job whose pod template breaks the CRD schema.
func TestAPIServerValidates(t *testing.T) {
	cfg := kubeenv.Kube(t)
	c, err := client.New(cfg, client.Options{Scheme: kubeenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := flytetest.LoadTemplate(t, "upstream-pytorch-v1")
	j, err := BuildPyTorchJob(tmpl, fixedPods{tmpl}, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	j.Name, j.Namespace = "broken", "default"
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(j)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: raw}
	// An integer field given as text breaks the CRD's schema.
	_ = unstructured.SetNestedField(u.Object, "many", "spec", "pytorchReplicaSpecs", "Worker", "replicas")
	err = c.Create(context.Background(), u)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "replicas") {
		t.Fatalf("create of a job with replicas \"many\": %v, want Invalid", err)
	}
}
