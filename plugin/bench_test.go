package plugin

import (
	"context"
	"testing"

	"github.com/kfelastic/kfelastic/internal/test/flytetest"
)

func BenchmarkBuildResource(b *testing.B) {
	ctx := context.Background()
	tmpl := flytetest.LoadTemplate(b, "upstream-pytorch-v1")
	tctx := flytetest.Task{Template: tmpl, Name: "bench", Namespace: "ns", Prefix: "s3://bucket/m", Store: memStore(b)}.Context(ctx)
	p := New("pytorch", testConfig(), nil)
	for b.Loop() {
		if _, err := p.BuildResource(ctx, tctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuildResourceUpstream(b *testing.B) {
	ctx := context.Background()
	tmpl := flytetest.LoadTemplate(b, "upstream-pytorch-v1")
	tctx := flytetest.Task{Template: tmpl, Name: "bench", Namespace: "ns", Prefix: "s3://bucket/m", Store: memStore(b)}.Context(ctx)
	p := upstreamPlugin(b, "pytorch")
	for b.Loop() {
		if _, err := p.BuildResource(ctx, tctx); err != nil {
			b.Fatal(err)
		}
	}
}
