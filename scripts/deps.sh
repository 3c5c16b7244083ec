#!/usr/bin/env bash
# Installs or builds what the tests, benchmarks and demo need, idempotently,
# into $KFELASTIC_CACHE (default ~/.cache/kfelastic, outside any clone so that
# fresh checkouts on the same machine reuse it). Usage: deps.sh [all|apt|torch|minio|h2spec|k8s|cluster|coredns|worker-root|protoc|torch2|flytekit]
# (torch: Debian's python3-torch alone, for make demo; torch2: torch 2.14 in a
# Debian sid root, run by scripts/torch-python 2.14; k8s: etcd, kube-apiserver,
# CRDs, training operator; cluster: k8s and the one-node cluster;
# flytekit: real flytekit 1.16.24 for the process-level tests)
set -euo pipefail
CACHE=${KFELASTIC_CACHE:-$HOME/.cache/kfelastic}
BIN=$CACHE/bin
mkdir -p "$BIN" "$CACHE/logs"
log() { printf '[deps %s] %s\n' "$(date -u +%T)" "$*" >&2; }
# took LABEL START RC: says how long a step that did work took (from
# $SECONDS at START) and the CPU its processes used, for the cold figures
# in README.md; returns RC. Call it in the shell (or the `{ … } &` group)
# that ran the step: `times` counts the children that shell waited for.
# `times` runs in this shell (a redirect forks nothing); in a $(…) it
# would report the fresh subshell's zeros.
took() {
  if [ $((SECONDS - $2)) -ge 3 ]; then
    local f=$CACHE/logs/.times.$BASHPID cpu
    times >"$f"
    cpu=$(awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } printf "%d", s }' "$f")
    rm -f "$f"
    log "$1: done in $((SECONDS - $2)) s, $cpu CPU-s (rc $3)"
  fi
  return "$3"
}

# apt_install LOG PACKAGE…: Debian's packages, one apt-get at a time (two
# would fight over dpkg's lock), its output in $CACHE/logs/LOG.log.
apt_install() {
  local name=$1; shift
  export DEBIAN_FRONTEND=noninteractive
  local sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq >"$CACHE/logs/$name.log" 2>&1 &&
    $sudo apt-get install -y -qq --no-install-recommends "$@" >>"$CACHE/logs/$name.log" 2>&1
}

need_apt() {
  local missing=()
  [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null || missing+=(python3-torch)
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v protoc >/dev/null || missing+=(protobuf-compiler)
  command -v curl >/dev/null || missing+=(curl)
  # go test -race needs cgo, so a C compiler and the C library's headers.
  command -v gcc >/dev/null && [ -e /usr/include/stdlib.h ] || missing+=(gcc libc6-dev)
  # Headless Chromium loads the failure report in report/'s browser test.
  command -v chromium >/dev/null || missing+=(chromium)
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]} (≈1 min)"
  apt_install apt "${missing[@]}"
}

# Debian's torch alone: all that make demo needs beside the Go build.
need_torch() {
  /usr/bin/python3 -c 'import torch' 2>/dev/null && return 0
  log "apt-get install python3-torch (≈1 min)"
  apt_install apt python3-torch
}

# MinIO, the S3 server of the tests, at a pinned version (what @latest was
# on 2026-12-07): a fresh machine builds the server the suite was run on.
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
need_minio() {
  [ -x "$BIN/minio" ] && return 0
  log "building MinIO $MINIO_VERSION into $BIN (≈3 min, test server only)"
  GOBIN="$BIN" GOFLAGS= go install "github.com/minio/minio@$MINIO_VERSION" >"$CACHE/logs/minio.log" 2>&1
}

# h2spec, the HTTP/2 conformance suite the master's transports are held to
# (internal/test/h2test, run by master/h2spec_test.go and
# master/h2/h2spec_test.go). v2.2.1 is the version the module proxy serves.
need_h2spec() {
  [ -x "$BIN/h2spec" ] && return 0
  log "building h2spec into $BIN (≈30 s)"
  GOBIN="$BIN" GOFLAGS= go install github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible >"$CACHE/logs/h2spec.log" 2>&1 ||
    { log "h2spec build failed (see $CACHE/logs/h2spec.log): its test will skip"; return 0; }
}

# The kube-apiserver for envtest: a wrapper module that requires
# k8s.io/kubernetes and pins its staging modules, as ../shared/ENVIRONMENT.md
# describes. etcd comes from Debian; envtest finds both in $CACHE/k8s.
K8S_VERSION=1.33.13
need_k8s() {
  local dir=$CACHE/k8s
  mkdir -p "$dir"
  [ -e "$dir/etcd" ] || ln -sf "$(command -v etcd)" "$dir/etcd"
  [ -x "$dir/kube-apiserver" ] && return 0
  log "building kube-apiserver v$K8S_VERSION into $dir (≈4–7 min)"
  build_k8s kube-apiserver kube-apiserver
}

# build_k8s NAME CMD…: builds k8s.io/kubernetes/cmd/CMD… at $K8S_VERSION into
# $CACHE/k8s from a wrapper module $CACHE/src/NAME that requires
# k8s.io/kubernetes and pins its staging modules (../shared/ENVIRONMENT.md);
# each binary is moved into place only once all are built.
build_k8s() {
  local name=$1; shift
  local dir=$CACHE/k8s src=$CACHE/src/$name v=$K8S_VERSION
  mkdir -p "$src" "$dir/.tmp-$name"
  local staging="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission"
  {
    echo "module kfelastic.local/$name"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes v$v"
    echo
    echo "replace ("
    for m in $staging; do echo "	k8s.io/$m => k8s.io/$m v0.${v#1.}"; done
    echo ")"
  } >"$src/go.mod"
  local pkgs=() c
  { printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for c in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    printf ')\n'; } >"$src/tools.go"
  (cd "$src" && GOFLAGS=-mod=mod go mod tidy >"$CACHE/logs/$name.log" 2>&1 &&
    GOFLAGS=-mod=mod go build -o "$dir/.tmp-$name/" \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v$v -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${v#1.}" \
      "${pkgs[@]}" >>"$CACHE/logs/$name.log" 2>&1) || { log "$* build failed: see $CACHE/logs/$name.log"; tail -20 "$CACHE/logs/$name.log" >&2; return 1; }
  for c in "$@"; do mv "$dir/.tmp-$name/$c" "$dir/$c"; done
  rmdir "$dir/.tmp-$name"
}

# The one-node cluster whose pods really run (internal/test/kubeenv/cluster.go):
# containerd, runc, the CNI plugins and a static busybox (the training
# operator's init container) from Debian, kubelet, kube-scheduler
# and kube-controller-manager at the API server's version, CoreDNS, and a
# Debian root file system with python3-torch for the worker image.
COREDNS_VERSION=v1.13.1
need_cluster() {
  need_cluster_apt
  need_node_bins & local p1=$!
  need_coredns & local p2=$!
  need_worker_root & local p3=$!
  local rc=0
  wait $p1 || rc=1; wait $p2 || rc=1; wait $p3 || rc=1
  return $rc
}

# The cluster's Debian packages.
need_cluster_apt() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  [ -x /bin/busybox ] || missing+=(busybox-static)
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  apt_install cluster-apt "${missing[@]}"
}

# kubelet, kube-scheduler and kube-controller-manager, after the API
# server's build: they share its module cache and most of its compiled
# packages.
need_node_bins() {
  local dir=$CACHE/k8s
  [ -x "$dir/kubelet" ] && [ -x "$dir/kube-scheduler" ] && [ -x "$dir/kube-controller-manager" ] && return 0
  log "building kubelet, kube-scheduler, kube-controller-manager v$K8S_VERSION into $dir (≈5–8 min)"
  build_k8s kube-node kubelet kube-scheduler kube-controller-manager
}

# CoreDNS with the plugins the cluster's Corefile uses and no others
# (testenv's startNode: bind, errors, kubernetes, cache, template), built
# from a main of its own as CoreDNS documents for a custom build: its stock
# build compiles ≈50 plugins and their clouds' SDKs (route53, Azure,
# Cloud DNS, etcd, …), about twice the work on a cold machine.
COREDNS_PLUGINS="bind errors kubernetes cache template"
need_coredns() {
  [ -x "$BIN/coredns" ] && return 0
  log "building CoreDNS $COREDNS_VERSION (plugins: $COREDNS_PLUGINS) into $BIN (≈1–2 min)"
  local src=$CACHE/src/coredns p
  mkdir -p "$src"
  printf 'module kfelastic.local/coredns\n\ngo 1.26.0\n\nrequire github.com/coredns/coredns %s\n' "$COREDNS_VERSION" >"$src/go.mod"
  { printf '// CoreDNS with only the plugins the test cluster uses (scripts/deps.sh).\npackage main\n\nimport (\n'
    for p in $COREDNS_PLUGINS; do printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"; done
    printf '\n\t"github.com/coredns/coredns/coremain"\n)\n\nfunc main() { coremain.Run() }\n'; } >"$src/main.go"
  (cd "$src" && GOFLAGS=-mod=mod go mod tidy >"$CACHE/logs/coredns.log" 2>&1 &&
    GOFLAGS=-mod=mod go build -o "$BIN/coredns.tmp" . >>"$CACHE/logs/coredns.log" 2>&1 &&
    mv "$BIN/coredns.tmp" "$BIN/coredns") ||
    { log "CoreDNS build failed: see $CACHE/logs/coredns.log"; return 1; }
}

# The worker image's root file system: Debian bookworm (minbase) with
# python3-torch 1.13, as the machine's own; ≈4.5 min cold, 1.3 GB. The
# cluster turns it into an image (internal/test/kubeenv) and imports it.
need_worker_root() {
  local root=$CACHE/worker-root
  if [ -x "$root/usr/bin/python3" ] && [ -d "$root/usr/lib/python3/dist-packages/torch" ]; then
    need_worker_flytekit_debs "$root"
    return
  fi
  log "debootstrap bookworm with python3-torch into $root (≈4.5 min, 1.3 GB)"
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  rm -rf "$root.tmp"
  $SUDO debootstrap --variant=minbase bookworm "$root.tmp" http://deb.debian.org/debian >"$CACHE/logs/worker-root.log" 2>&1 &&
    $SUDO chroot "$root.tmp" apt-get install -y -qq --no-install-recommends python3-torch >>"$CACHE/logs/worker-root.log" 2>&1 &&
    $SUDO chroot "$root.tmp" apt-get clean >>"$CACHE/logs/worker-root.log" 2>&1 &&
    rm -rf "$root" && mv "$root.tmp" "$root" ||
    { log "worker root failed: see $CACHE/logs/worker-root.log"; return 1; }
  need_worker_flytekit_debs "$root"
}

# need_worker_flytekit_debs ROOT: the Debian packages real flytekit needs
# (flytekit_debs) in the worker root, for the e2e scenarios that run
# pyflyte-execute in a pod (E9); ≈1–4 min the first time. Without them only
# those scenarios skip.
need_worker_flytekit_debs() {
  local root=$1 missing=() p pkgs
  pkgs=$(flytekit_debs) || { log "no flytekit package list: the real-flytekit e2e scenarios will skip"; return 0; }
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  for p in $pkgs; do $SUDO chroot "$root" dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "worker root: apt-get install ${missing[*]} (real flytekit's Debian packages, ≈1–4 min)"
  { $SUDO chroot "$root" apt-get update -qq &&
    $SUDO chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" &&
    $SUDO chroot "$root" apt-get clean; } >>"$CACHE/logs/worker-root.log" 2>&1 ||
    log "worker root: flytekit's packages failed (see $CACHE/logs/worker-root.log): the real-flytekit e2e scenarios will skip"
  return 0
}

# The Kubeflow CRDs, from the training-operator module's manifests.
need_crds() {
  local dir=$CACHE/crds
  [ -f "$dir/kubeflow.org_pytorchjobs.yaml" ] && [ -f "$dir/kubeflow.org_tfjobs.yaml" ] && return 0
  mkdir -p "$dir"
  local mod
  mod=$(GOFLAGS= go mod download -json github.com/kubeflow/training-operator@v1.8.1 | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  cp "$mod/manifests/base/crds/kubeflow.org_pytorchjobs.yaml" "$mod/manifests/base/crds/kubeflow.org_tfjobs.yaml" "$dir/"
  chmod u+w "$dir"/*.yaml
}

# The real Kubeflow training operator, for the plugin's, the master's and
# the e2e tests. (Their simulated nodes are the tests' own,
# kubeenv.StartSimNodes: kwok, used before, was ≈350 CPU-s of a cold build.)
need_operator() {
  [ -x "$BIN/training-operator.v1" ] || {
    log "building the Kubeflow training operator (≈2 min)"
    GOBIN="$BIN" GOFLAGS= go install github.com/kubeflow/training-operator/cmd/training-operator.v1@v1.8.1 >"$CACHE/logs/training-operator.log" 2>&1
  }
}

# The protocol's code generators, pinned (make generate).
need_protoc() {
  need_apt
  local gv=${PROTOC_GEN_GO_VERSION:-v1.36.12} rv=${PROTOC_GEN_GO_GRPC_VERSION:-v1.6.0}
  "$BIN/protoc-gen-go" --version 2>/dev/null | grep -q "${gv}$" ||
    GOBIN="$BIN" GOFLAGS= go install "google.golang.org/protobuf/cmd/protoc-gen-go@$gv"
  "$BIN/protoc-gen-go-grpc" --version 2>/dev/null | grep -q "${rv#v}$" ||
    GOBIN="$BIN" GOFLAGS= go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$rv"
}

# torch 2.x for every torch-facing test, benchmark and user
# (scripts/torch-python 2.14): Debian unstable's python3-torch (2.14.1,
# Python 3.14, gloo) in a debootstrap root under $CACHE/torch-sid. It
# replaces the trixie root ($CACHE/torch2, torch 2.6) that this built before:
# 2.14 is the torch users train on and speaks the same store protocol as 2.6
# (2.2+ numbering, handshake), so one 2.x root covers what two did, for half
# the build. (An old $CACHE/torch2 is left alone; nothing reads it now.)
# Part of `all`, beside the long builds: ≈5 min cold and ≈1.4 GB; the tests
# that need it skip with a note when it is absent.
need_torch2() {
  local root=$CACHE/torch-sid log=$CACHE/logs/torch-sid.log
  # The root is moved into place only once complete.
  [ -d "$root/usr/lib/python3/dist-packages/torch" ] && return 0
  export DEBIAN_FRONTEND=noninteractive
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  # One chain: `all` calls this under ||, where set -e does not stop a
  # failed step, and a half-made root must never be moved into place.
  { command -v debootstrap >/dev/null || apt_install torch-sid debootstrap; } &&
    log "debootstrap sid with python3-torch into $root (≈5 min, 1.4 GB)" &&
    $SUDO rm -rf "$root.tmp" &&
    $SUDO debootstrap --variant=minbase sid "$root.tmp" http://deb.debian.org/debian >>"$log" 2>&1 &&
    $SUDO chroot "$root.tmp" apt-get install -y -qq --no-install-recommends python3-torch >>"$log" 2>&1 &&
    $SUDO chroot "$root.tmp" apt-get clean >>"$log" 2>&1 &&
    $SUDO rm -rf "$root" &&
    $SUDO mv "$root.tmp" "$root"
}

# Real flytekit 1.16.24 for the tests that run pyflyte-execute itself
# (internal/test/testenv/flytekit.go): the tarball in $KFELASTIC_FLYTEKIT
# (default ../shared/flytekit beside the repository; it is a fixture, never
# copied into the repository) unpacked into $CACHE/flytekit-1.16.24, and
# the Debian packages its README lists (for /usr/bin/python3: bookworm's
# Python 3.11 with torch 1.13). A warm run costs a dpkg -s per package.
FLYTEKIT_VERSION=1.16.24
flytekit_src() { echo "${KFELASTIC_FLYTEKIT:-$(cd "$(dirname "$0")/.." && pwd)/../shared/flytekit}"; }

# flytekit_debs: the Debian packages real flytekit needs: its README's list
# (the python3-* names after "comes from Debian"), and botocore for the
# tests' s3:// (testdata/flytekit/s3: s3fs is not in Debian).
flytekit_debs() {
  local pkgs
  pkgs=$(sed -n '/comes from Debian/,/^Use:/p' "$(flytekit_src)/README.md" 2>/dev/null | grep -o 'python3-[a-z0-9.+-]*' | sort -u || true)
  [ -n "$pkgs" ] || return 1
  echo $pkgs python3-botocore
}

need_flytekit() {
  local src
  src=$(flytekit_src)
  local tarball=$src/flytekit-$FLYTEKIT_VERSION-site.tar.gz dir=$CACHE/flytekit-$FLYTEKIT_VERSION
  [ -f "$tarball" ] && [ -f "$src/README.md" ] || { log "no $tarball (KFELASTIC_FLYTEKIT)"; return 1; }
  local pkgs missing=() p
  pkgs=$(flytekit_debs) || { log "no Debian packages listed in $src/README.md"; return 1; }
  for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]} (flytekit's Debian packages, ≈1 min)"
    apt_install flytekit "${missing[@]}" || { log "flytekit's packages failed: see $CACHE/logs/flytekit.log"; return 1; }
  fi
  if [ -f "$dir/site/flytekit/__init__.py" ] && [ -x "$dir/pyflyte-execute" ]; then
    flytekit_bytecode "$dir/site"
    return 0
  fi
  log "unpacking $tarball into $dir"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp" &&
    tar -xzf "$tarball" -C "$dir.tmp" &&
    [ -f "$dir.tmp/site/flytekit/__init__.py" ] && [ -x "$dir.tmp/pyflyte-execute" ] &&
    flytekit_bytecode "$dir.tmp/site" &&
    rm -rf "$dir" && mv "$dir.tmp" "$dir" ||
    { log "cannot unpack $tarball"; rm -rf "$dir.tmp"; return 1; }
}

# flytekit_bytecode SITE: compiles the unpacked modules once (Debian's
# Python, as the tests and the worker image run them). The tarball has no
# bytecode, and where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines) Python never writes any: every process that imported flytekit
# compiled its ≈590 modules again (0.4–0.5 CPU-s a pyflyte-execute, ≈30 of
# them a make test).
flytekit_bytecode() {
  [ -d "$1/flytekit/__pycache__" ] && return 0
  /usr/bin/python3 -m compileall -q "$1" >/dev/null 2>&1 || log "compileall $1 failed: flytekit is compiled at each import"
  return 0
}

what=${1:-all}
case $what in
  apt) need_apt ;;
  torch) need_torch ;;
  minio) need_minio ;;
  h2spec) need_h2spec ;;
  protoc) need_protoc ;;
  torch2) need_torch2 ;;
  flytekit) need_flytekit ;;
  worker-root) need_worker_root ;;
  coredns) need_coredns ;;
  k8s) need_apt; need_k8s; need_crds; need_operator ;;
  cluster) need_apt; need_k8s; need_crds; need_operator; need_cluster ;;
  all)
    need_apt
    # The cluster's packages now, so that its long steps run beside the
    # others below; without them only the e2e tests skip, with a note.
    need_cluster_apt || log "the cluster's packages failed (see $CACHE/logs/cluster-apt.log): the e2e tests will skip"
    # flytekit's Debian packages too, before the steps below (one apt-get
    # at a time); warm, a dpkg -s per package.
    need_flytekit || log "no real flytekit: the real-flytekit tests will skip"
    # Every long step at once, each skipped when cached: the builds share
    # the CPUs, the two debootstraps mostly wait on the network and the
    # disk. Measured cold on 2 cores: README.md.
    start=$SECONDS
    { t=$SECONDS; rc=0; need_minio && need_h2spec || rc=$?; took "MinIO, h2spec" $t $rc; } & p1=$!
    # The node's binaries after the API server (need_node_bins).
    { t=$SECONDS; rc=0; need_k8s && { need_node_bins || log "the node's binaries failed (see $CACHE/logs/kube-node.log): the e2e tests will skip"; } || rc=$?
      took "kube-apiserver, the node's binaries" $t $rc; } & p2=$!
    { t=$SECONDS; rc=0; need_operator && { need_coredns || log "no CoreDNS: the e2e tests will skip"; } || rc=$?
      took "the operator, CoreDNS" $t $rc; } & p3=$!
    # torch 2.14 for the 2.x side of the torch tests; without it those
    # tests skip with a note, so a failed debootstrap does not fail the run.
    { t=$SECONDS; need_torch2 || log "no torch 2.14 root (see $CACHE/logs/torch-sid.log): its tests will skip"; took "torch 2.14 root" $t 0; } & p4=$!
    { t=$SECONDS; need_worker_root || log "no worker root (see $CACHE/logs/worker-root.log): the e2e tests will skip"; took "worker root" $t 0; } & p5=$!
    need_crds
    wait $p1; wait $p2; wait $p3; wait $p4; wait $p5
    took "all dependencies" $start 0
    ;;
  *) echo "usage: $0 [all|apt|torch|minio|h2spec|k8s|cluster|coredns|worker-root|protoc|torch2|flytekit]" >&2; exit 2 ;;
esac
