package depspin

import (
	_ "github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/plugins/kubeflow"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/ioutils"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/k8s"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/k8s/kfoperators/pytorch"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/k8s/kfoperators/tensorflow"
	_ "github.com/flyteorg/flyte/flytepropeller/pkg/controller/nodes/task/k8s"
	_ "github.com/flyteorg/flyte/flytestdlib/config"
	_ "github.com/flyteorg/flyte/flytestdlib/storage"
	_ "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/cobra"
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/memblob"
	_ "gocloud.dev/blob/s3blob"
	_ "golang.org/x/sys/unix"
	_ "google.golang.org/grpc"
	_ "sigs.k8s.io/controller-runtime/pkg/envtest"
)
