package plugin

import (
	"context"
	"net/url"
	"strings"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	flyteerr "github.com/flyteorg/flyte/flyteplugins/go/tasks/errors"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/flytek8s"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/flytek8s/config"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/utils"
	"github.com/flyteorg/flyte/flytestdlib/storage"
	corev1 "k8s.io/api/core/v1"
)

// flytePods renders replica pod templates with flytek8s, as upstream's
// kfoperators do: the task's container with inputs, outputs, platform
// resources and overrides, the replica's own resources when it has some,
// and the configured default labels and annotations.
type flytePods struct {
	ctx  context.Context
	tCtx pluginsCore.TaskExecutionContext
}

func (f *flytePods) PodTemplate(res *core.Resources) (corev1.PodTemplateSpec, string, error) {
	var opts []flytek8s.PluginTaskExecutionContextOption
	if res != nil && (len(res.GetLimits()) > 0 || len(res.GetRequests()) > 0) {
		r, err := flytek8s.ToK8sResourceRequirements(res)
		if err != nil {
			return corev1.PodTemplateSpec{}, "", flyteerr.Errorf(flyteerr.BadTaskSpecification, "invalid replica resources %v: %v", res, err)
		}
		*r = flytek8s.ApplyK8sResourceOverrides(f.tCtx.TaskExecutionMetadata(), r)
		opts = append(opts, flytek8s.WithResources(r))
	}
	tc := flytek8s.NewPluginTaskExecutionContext(f.tCtx, opts...)
	spec, meta, primary, err := flytek8s.ToK8sPodSpec(f.ctx, tc)
	if err != nil {
		return corev1.PodTemplateSpec{}, "", err
	}
	cfg := config.GetK8sPluginConfig()
	md := tc.TaskExecutionMetadata()
	meta.Annotations = utils.UnionMaps(cfg.DefaultAnnotations, meta.Annotations, utils.CopyMap(md.GetAnnotations()))
	meta.Labels = utils.UnionMaps(cfg.DefaultLabels, meta.Labels, utils.CopyMap(md.GetLabels()))
	return corev1.PodTemplateSpec{ObjectMeta: *meta, Spec: *spec}, primary, nil
}

// ErrorPrefixURL turns the task's output prefix, a flytestdlib
// DataReference, into the gocloud.dev URL the agent writes documents under:
// s3://bucket/key and gs://bucket/key keep their form, with query (the
// configured errorPrefixQuery, e.g. a MinIO endpoint) added to s3 ones; a
// local path becomes file://. The agent finds credentials and, without a
// query, the endpoint in its pod's environment as any AWS/GCS SDK does; a
// deployment must give the training pods the same storage access flytekit
// needs to upload outputs.
func ErrorPrefixURL(ref storage.DataReference, query string) (string, error) {
	s := string(ref)
	if strings.HasPrefix(s, "/") {
		return (&url.URL{Scheme: "file", Path: s}).String(), nil
	}
	scheme, container, key, err := ref.Split()
	if err != nil {
		return "", flyteerr.Errorf(flyteerr.BadTaskSpecification, "output prefix %q: %v", s, err)
	}
	u := url.URL{Scheme: scheme, Host: container, Path: "/" + strings.Trim(key, "/")}
	switch scheme {
	case "s3":
		u.RawQuery = query
	case "gs", "azblob", "file", "mem":
	default:
		return "", flyteerr.Errorf(flyteerr.BadTaskSpecification, "output prefix %q: scheme %q has no gocloud.dev driver in the agent", s, scheme)
	}
	return u.String(), nil
}
