# The Flyte plugin (plugin/, kfoperator/): benchmark beside upstream's
# PyTorch plugin, and the flags generator.
BENCHES += plugin

.PHONY: bench-plugin plugin-pflags image

# BuildResource and GetTaskPhase (terminal, 100 pods, 100 documents on MinIO,
# pods on a real kube-apiserver), ours beside upstream's, in one run.
bench-plugin: deps
	$(GO) run ./bench/plugin

# Regenerates plugin/config_flags*.go. flytestdlib's pflags generator is built
# in a scratch module: its dependencies (x/tools, gogen) are not this module's.
PFLAGS := $(CACHE)/bin/pflags
$(PFLAGS):
	mkdir -p $(CACHE)/src/pflags && cd $(CACHE)/src/pflags && \
	  printf 'module pflagsbuild\n\ngo 1.26.0\n\nrequire github.com/flyteorg/flyte/flytestdlib v1.16.8\n' > go.mod && \
	  printf 'package main\n\nimport _ "github.com/flyteorg/flyte/flytestdlib/cli/pflags/api"\n\nfunc main() {}\n' > main.go && \
	  GONOSUMDB=github.com/flyteorg GOFLAGS=-mod=mod $(GO) build -o $(PFLAGS) github.com/flyteorg/flyte/flytestdlib/cli/pflags

plugin-pflags: $(PFLAGS)
	cd plugin && PATH=$(CACHE)/bin:$$PATH $(GO) generate ./...

# The real training operator for plugin/lifecycle_test.go is
# built (once, cached) by scripts/deps.sh k8s, which `make test` runs.
.PHONY: deps-operator
deps-operator:
	scripts/deps.sh k8s

# The agent image the plugin defaults to (ghcr.io/kfelastic/kfelastic:<VERSION>):
# FROM scratch, the static binary at /kfelastic, entrypoint /kfelastic. Built
# without any container daemon as an OCI image layout in out/image
# (internal/ociimage); the Dockerfile builds the same image with a daemon.
# Push it with an OCI tool, e.g. skopeo copy oci:out/image docker://REPO:TAG.
image:
	$(GO) run ./internal/ociimage/mkimage -version $(VERSION) -out out/image
