// Command flytepropeller-kfelastic is flytepropeller (the version in go.mod,
// its own command line and config) with the kfelastic plugin linked in:
// kfelastic-pytorch and kfelastic-tensorflow, beside the plugins a workflow
// needs around them (container, sidecar, k8s-array) and upstream's own
// kubeflow plugins, so the same propeller can run either for a comparison.
// Which ones run, and which one a task type gets, is propeller's config
// (tasks.task-plugins.enabled-plugins, default-for-task-types).
//
// It is kept out of the kfelastic binary: propeller's dependencies have no
// place in the pods' static binary.
package main

import (
	"github.com/flyteorg/flyte/flytepropeller/cmd/controller/cmd"

	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/array/k8s"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/k8s/kfoperators/pytorch"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/k8s/kfoperators/tensorflow"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/k8s/pod"

	_ "github.com/kfelastic/kfelastic/plugin"
)

func main() {
	cmd.Execute()
}
