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
# The suite runs through internal/test/runtests rather than go test:
#
# - It links each package's test binary into $(TESTBIN), in the cache, and
#   an unchanged one is not linked again (go test links all ≈30 every run:
#   ≈170 CPU-s of a warm run on 2 cores, 2026-12-07; up to date, 1.2 s).
#   The binaries are linked without their symbol table and DWARF (-s -w,
#   a quarter off each link); stack traces and the race detector's
#   reports name functions from the runtime's own tables, which stay.
# - It runs two binaries at a time, the four longest packages first
#   (BIG_PACKAGES: agent and local ≈8 min each on 2 cores, e2e and
#   cmd/kfelastic ≈8.5, warm, 2026-12-07), then the rest in the order
#   given, longest first (torchhook ≈2.5 min, master ≈2, storerelay,
#   nodecheck, kube), then the short ones; once the four have ended, three
#   at a time (-tail-p): the short packages wait on servers and timers and
#   left the CPUs a third idle, two at a time, in the last 5 minutes.
#   Three at a time throughout was tried (2026-12-07, warm): no faster (the
#   run is bound by CPU), 11 % more Python CPU from the contention, and two
#   load-timing failures in agent and cmd/kfelastic.
# - The master's and the store relay's suites run again on grpc-go's
#   server (--transport grpc is a supported choice) from the same
#   binaries: tests that name no transport take
#   $$KFELASTIC_MASTER_TRANSPORT; those that run every transport
#   themselves, or none, are skipped there (≈1.5 min). The leg's torch
#   tests run on torch 1.13 only: the transport is the master's side of
#   the relay, which torch's client never sees, and the main run has
#   them on both torches.
#
# vet runs with the tests' build flags (-race, cgo): the packages it
# compiles to type-check are then the ones the tests link, one compiled set
# of every dependency on a cold machine instead of two (vet alone took
# ≈9 min cold on 2 cores). go test's own vet, a subset, is off.
TESTBIN = $(CACHE)/testbin/$(shell printf %s '$(CURDIR)' | sha256sum | cut -c1-12)
BIG_PACKAGES := ./agent/,./local/,./e2e/,./cmd/kfelastic/
TEST_PACKAGES := ./agent/ ./local/ ./e2e/ ./cmd/kfelastic/ ./agent/torchhook/ ./master/ ./agent/storerelay/ ./agent/nodecheck/ ./master/kube/ ./...
GRPC_LEG_SKIP := TestH2spec|TestTransports|TestUnauthenticatedCallsCostNoMemory|TestSim|TestScenarios|FuzzJob|FuzzStateDecode
# The -buildflag list is testenv.RaceBuildFlags (and -vet=off), which
# flytepropeller is built with (testenv's TestRaceBuildFlagsAreMakeTests).
RUNTESTS = CGO_ENABLED=1 $(GO) run ./internal/test/runtests -o $(TESTBIN) \
	-buildflag=-race -buildflag=-vet=off -buildflag=-ldflags=-s\ -w \
	-p 2 -tail-p 3 -big $(BIG_PACKAGES) -timeout 45m \
	-leg-env KFELASTIC_MASTER_TRANSPORT=grpc -leg-env KFELASTIC_TORCH=1.13 -leg-skip '$(GRPC_LEG_SKIP)' -leg-pkgs ./master/,./agent/storerelay/
test: test-prepare
	$(RUNTESTS) $(TEST_PACKAGES)

# What the tests need, ready: the dependencies (scripts/deps.sh all) and,
# beside them, the tests' own compile: go vet with the tests' flags, which
# compiles every package the tests link (flytepropeller's too: the e2e
# tests build it with their flags, testenv.RaceBuild), the test binaries'
# links, then what the static kfelastic the tests start imports
# (testenv.StaticBuild's flags; its packages, not the binary: go build
# links a main package even where it discards it). On a
# cold machine the dependencies' downloads and debootstraps wait on the
# network, time this compile can use; warm, each step is a no-op in
# seconds. Only Debian's packages come first: go vet -race needs gcc.
test-prepare:
	@scripts/deps.sh apt
	@scripts/deps.sh all & deps=$$!; rc=0; \
	$(MAKE) --no-print-directory vet VET_BUILD=-race CGO_ENABLED=1 || rc=$$?; \
	if [ $$rc -eq 0 ]; then $(RUNTESTS) -link-only $(TEST_PACKAGES) || rc=$$?; fi; \
	if [ $$rc -eq 0 ]; then CGO_ENABLED=0 $(GO) build -trimpath $$($(GO) list -f '{{join .Imports "\n"}}' ./cmd/kfelastic | grep '\.') || rc=$$?; fi; \
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
