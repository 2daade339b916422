#!/usr/bin/env bash
# Builds what a real kubelet node needs (docs/design.md §9) into the same
# version-keyed cache as hack/build-cluster-tools.sh: kubelet (from that
# script's wrapper module, so it must have run first), containerd with ctr
# and the runc shim, and our static pause binary. runc and busybox come from
# Debian (hack/install-system-deps.sh); the pod network's CNI plugin is
# Python (localcluster/realnode/cni.py) and the NIC hand-off's is built by
# `make nic-cni`. Idempotent: a cached tool is not rebuilt.
# Usage: hack/build-node-tools.sh [containerd|pause|kubelet ...] (default: all)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
TOOL_LOG_NAME=build-node-tools
# shellcheck source=go-build-env.sh
source "$HERE/go-build-env.sh"

build_containerd() {
  local dir="$BIN/containerd-$CONTAINERD_VERSION"
  if [[ -x "$dir/containerd" && -x "$dir/ctr" && -x "$dir/containerd-shim-runc-v2" ]]; then
    say "containerd $CONTAINERD_VERSION: cached"; return
  fi
  say "containerd $CONTAINERD_VERSION: building containerd, ctr, containerd-shim-runc-v2"
  local m=github.com/containerd/containerd/v2
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
  GOBIN="$dir.tmp" go install -trimpath -ldflags "-s -w -X $m/version.Version=$CONTAINERD_VERSION" \
    "$m/cmd/containerd@$CONTAINERD_VERSION" "$m/cmd/ctr@$CONTAINERD_VERSION" \
    "$m/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
}

build_pause() {
  local dir="$BIN/pause-$PAUSE_VERSION"
  if [[ -x "$dir/pause" ]]; then say "pause $PAUSE_VERSION: cached"; return; fi
  say "pause $PAUSE_VERSION: building"
  local mod="$SRC/pause-$PAUSE_VERSION"
  rm -rf "$mod"; mkdir -p "$mod" "$dir"
  cp "$HERE/node-tools/pause.go" "$mod/main.go"
  (cd "$mod" && go mod init toposerve.local/pause >/dev/null 2>&1 \
     && go build -trimpath -ldflags "-s -w" -o "$mod/pause.out" .)
  mv "$mod/pause.out" "$dir/pause"
}

build_kubelet() {
  local dir="$BIN/kubelet-$K8S_VERSION"
  if [[ -x "$dir/kubelet" ]]; then say "kubelet $K8S_VERSION: cached"; return; fi
  # The cluster tools' wrapper module already replaces every staging module
  # with its published version; kubelet is built from a copy of it, so the
  # module and build caches are shared and only kubelet's own packages compile.
  local base="$SRC/kubernetes-$K8S_VERSION"
  [[ -f "$base/go.mod" && -f "$base/go.sum" ]] \
    || die "no wrapper module in $base: run hack/build-cluster-tools.sh first"
  local mod="$SRC/kubelet-$K8S_VERSION"
  rm -rf "$mod"; mkdir -p "$mod/out"
  cp "$base/go.mod" "$base/go.sum" "$mod/"
  printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' >"$mod/tools.go"
  (cd "$mod" && go mod tidy)
  local pkg=k8s.io/component-base/version
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  say "kubelet $K8S_VERSION: compiling (cold: about ten minutes on 2 cores)"
  (cd "$mod" && go build -trimpath -o "$mod/out/" \
     -ldflags "-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
     k8s.io/kubernetes/cmd/kubelet)
  rm -rf "$dir"; mv "$mod/out" "$dir"
}

start=$(date +%s)
parts=("$@"); [[ ${#parts[@]} -gt 0 ]] || parts=(containerd pause kubelet)
for p in "${parts[@]}"; do
  case "$p" in
    containerd|pause|kubelet) "build_$p" ;;
    *) die "unknown part $p (containerd, pause, kubelet)" ;;
  esac
done
say "done in $(( $(date +%s) - start ))s; binaries in $BIN"
