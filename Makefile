# kfelastic — the two commands a newcomer needs are `make demo` and `make test`.
# Everything they need is installed or built into $(CACHE), idempotently.

CACHE ?= $(HOME)/.cache/kfelastic
export KFELASTIC_CACHE := $(CACHE)
GO ?= go
BIN := bin/kfelastic
# The version stamped into the binary (internal/version; `kfelastic version`)
# and the tag of its image, ghcr.io/kfelastic/kfelastic:<version>, which the
# plugin uses by default.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
VERSION_LDFLAGS := -X github.com/kfelastic/kfelastic/internal/version.version=$(VERSION)
# The static binary the plugin's init container copies into training pods.
export CGO_ENABLED ?= 0

# Each area adds its targets (bench-errors, bench-agent, bench-plugin, …) and
# appends its name to BENCHES in its own fragment mk/<area>.mk, so that areas
# evolve without touching this file.
BENCHES :=
include $(wildcard mk/*.mk)

.PHONY: all build deps test test-prepare test-short vet fmt demo bench clean

all: build

build:
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o $(BIN) ./cmd/kfelastic

deps:
	scripts/deps.sh all

# VET_BUILD: build flags for go vet (make test passes its own).
VET_BUILD ?=
vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }
	$(GO) vet $(VET_BUILD) ./...

# The full suite: real MinIO, real kube-apiserver + etcd, real torch workers,
# all under the race detector, in one run: e2e/'s test process is a harness
# (the binaries it starts are built static by the tests, CGO_ENABLED=0), so
# -race costs it little, and it runs once, beside the other packages.
# -race needs cgo (gcc: scripts/deps.sh) for this run only. The timeout is
# a package's: e2e's scenarios run two at a time, each within its own
# budget (e2e/harness_test.go), so that one that hangs fails alone, long
# before this kills the package.
#
# The four longest packages are named first, longest first, so that they
# start at once instead of the last of them starting after the others
# (`go test` starts packages in the order given, two at a time on 2 cores):
# agent and local (≈8 min each on 2 cores, warm, 2026-12-07), then e2e
# and cmd/kfelastic (≈8.5 each) as those end; then the longest of the
# rest (torchhook ≈2.5 min, master ≈2, storerelay, nodecheck, kube), so
# that none of them is left running alone at the end; the short ones
# fill in after. Three at a time (-p 3) was tried: a cold run at -p 3 had
# three load-timing failures.
#
# vet runs with the tests' build flags (-race, cgo): the packages it
# compiles to type-check are then the ones the tests link, one compiled set
# of every dependency on a cold machine instead of two (vet alone took
# ≈9 min cold on 2 cores). go test's own vet, a subset, is off.
#
# Then the master's and the store relay's suites again on grpc-go's server
# (--transport grpc is a supported choice): tests that name no transport
# take $KFELASTIC_MASTER_TRANSPORT; those that run every transport
# themselves, or none, are skipped there. ≈1.5 min on 2 cores.
# The test binaries are linked without their symbol table and DWARF
# (-s -w): go test links ≈60 of them each run, ≈12 CPU-s each for the big
# ones under -race, and -s -w takes a quarter off that (2026-12-07: 9.0
# against 12.4 CPU-s for agent/'s). Stack traces and the race detector's
# reports name functions from the runtime's own tables, which stay.
TEST_LDFLAGS := -ldflags=-s\ -w
TEST_PACKAGES := ./agent/ ./local/ ./e2e/ ./cmd/kfelastic/ ./agent/torchhook/ ./master/ ./agent/storerelay/ ./agent/nodecheck/ ./master/kube/ ./...
GRPC_LEG_SKIP := TestH2spec|TestTransports|TestUnauthenticatedCallsCostNoMemory|TestSim|TestScenarios|FuzzJob|FuzzStateDecode
test: test-prepare
	CGO_ENABLED=1 $(GO) test -race -vet=off -count=1 $(TEST_LDFLAGS) -timeout 45m $(TEST_PACKAGES)
	KFELASTIC_MASTER_TRANSPORT=grpc CGO_ENABLED=1 $(GO) test -race -vet=off -count=1 $(TEST_LDFLAGS) -timeout 15m -skip '$(GRPC_LEG_SKIP)' ./master/ ./agent/storerelay/

# What the tests need, ready: the dependencies (scripts/deps.sh all) and,
# beside them, the tests' own compile: go vet with the tests' flags, which
# compiles every package the tests link, then the static binaries the
# tests start (testenv.StaticBuild's flags). On a cold machine the
# dependencies' downloads and debootstraps wait on the network, time
# this compile can use; warm, each step is a no-op in seconds. Only
# Debian's packages come first: go vet -race needs gcc.
test-prepare:
	@scripts/deps.sh apt
	@scripts/deps.sh all & deps=$$!; rc=0; \
	$(MAKE) --no-print-directory vet VET_BUILD=-race CGO_ENABLED=1 || rc=$$?; \
	if [ $$rc -eq 0 ]; then CGO_ENABLED=0 $(GO) build -trimpath ./cmd/kfelastic ./cmd/flytepropeller-kfelastic || rc=$$?; fi; \
	wait $$deps || rc=$$?; exit $$rc

# Unit tests only: no external servers (they skip with a note).
test-short:
	$(GO) test -short ./...

# Only what the demo needs: Debian's torch, installed beside the Go build
# (scripts/demo.sh); not the test servers.
demo:
	BIN=$(BIN) GO=$(GO) REBUILD=1 scripts/demo.sh

bench: $(addprefix bench-,$(BENCHES))

clean:
	rm -rf bin out
