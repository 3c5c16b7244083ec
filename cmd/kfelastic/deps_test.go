package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The kfelastic binary runs in every training pod, so its memory is paid per
// pod (the agent's target: < 30 MiB RSS). Package init of flytestdlib's
// storage stack (stow, Azure, GCS) and of Kubernetes clients costs ≈50 MiB
// before main runs; those belong to the plugin (outputreader/flyteio,
// plugin/), never to this binary.
func TestBinaryLinksNoPluginStack(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/flyteorg/flyte/flytestdlib/storage",
			"github.com/flyteorg/flyte/flyteplugins",
			"github.com/Azure/",
			"cloud.google.com/go/storage",
			"k8s.io/client-go",
			"sigs.k8s.io/controller-runtime",
			"github.com/kubeflow/training-operator",
			"github.com/kfelastic/kfelastic/outputreader/flyteio",
			"github.com/kfelastic/kfelastic/plugin",
		} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("kfelastic links %s (via %s…): keep it out of the pod binary", pkg, banned)
			}
		}
	}
}
