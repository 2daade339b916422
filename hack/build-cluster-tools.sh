#!/usr/bin/env bash
# Builds the real cluster components from the Go module proxy into a cache
# outside the repository, keyed by version, so clean clones reuse them.
# Idempotent: a tool already in the cache is not rebuilt.
set -euo pipefail

TOOL_LOG_NAME=build-cluster-tools
# shellcheck source=go-build-env.sh
source "$(dirname "$0")/go-build-env.sh"

proxy_check() {
  go list -m -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null 2>&1 \
    || die "cannot reach the Go module proxy for k8s.io/kubernetes@$K8S_VERSION (GOPROXY=$(go env GOPROXY))"
}

have() { [[ -x "$BIN/$1" ]]; }

build_kwok() {
  local dir="$BIN/kwok-$KWOK_VERSION"
  if [[ -x "$dir/kwok" && -x "$dir/kwokctl" ]]; then say "kwok $KWOK_VERSION: cached"; return; fi
  say "kwok $KWOK_VERSION: building kwok and kwokctl"
  mkdir -p "$dir.tmp"
  GOBIN="$dir.tmp" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
}

build_etcd() {
  local dir="$BIN/etcd-$ETCD_VERSION"
  if [[ -x "$dir/etcd" ]]; then say "etcd $ETCD_VERSION: cached"; return; fi
  say "etcd $ETCD_VERSION: building"
  local mod="$SRC/etcd-$ETCD_VERSION"
  rm -rf "$mod"; mkdir -p "$mod"
  cat >"$mod/main.go" <<'GO'
// Command etcd runs the upstream etcd server entry point unchanged.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$mod" && go mod init toposerve.local/etcd >/dev/null 2>&1 \
     && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
     && go mod tidy \
     && go build -trimpath -o "$mod/etcd.out" .)
  mkdir -p "$dir"; mv "$mod/etcd.out" "$dir/etcd"
}

build_kubernetes() {
  local dir="$BIN/kubernetes-$K8S_VERSION"
  local tools=(kube-apiserver kube-controller-manager kube-scheduler)
  if [[ -x "$dir/kube-apiserver" && -x "$dir/kube-controller-manager" && -x "$dir/kube-scheduler" ]]; then
    say "kubernetes $K8S_VERSION: cached"; return
  fi
  proxy_check
  local mod="$SRC/kubernetes-$K8S_VERSION"
  rm -rf "$mod"; mkdir -p "$mod"
  local staging_version="v0.${K8S_VERSION#v1.}"
  # The replace list comes from the real go.mod, so a new release that adds
  # a staging module is handled without editing this script.
  local upstream_mod
  upstream_mod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  [[ -f "$upstream_mod" ]] || die "could not download go.mod of k8s.io/kubernetes@$K8S_VERSION"
  local staging
  staging="$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$upstream_mod")"
  {
    echo "module toposerve.local/kubernetes"
    echo
    echo "go $(awk '$1 == "go" {print $2; exit}' "$upstream_mod")"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    for m in $staging; do echo "replace $m => $m $staging_version"; done
  } >"$mod/go.mod"
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for t in "${tools[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$t\""; done
    echo ")"
  } >"$mod/tools.go"
  say "kubernetes $K8S_VERSION: resolving modules ($(wc -w <<<"$staging") staging modules replaced by $staging_version)"
  (cd "$mod" && go mod tidy)
  local pkg=k8s.io/component-base/version
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  mkdir -p "$mod/out"
  say "kubernetes $K8S_VERSION: compiling ${tools[*]} (cold: tens of minutes on 2 cores)"
  local pkgs=(); for t in "${tools[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$t"); done
  (cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$mod/out/" "${pkgs[@]}")
  rm -rf "$dir"; mv "$mod/out" "$dir"
}

build_helm() {
  local dir="$BIN/helm-$HELM_VERSION"
  if [[ -x "$dir/helm" ]]; then say "helm $HELM_VERSION: cached"; return; fi
  say "helm $HELM_VERSION: building"
  local mod="$SRC/helm-$HELM_VERSION"
  rm -rf "$mod"; mkdir -p "$mod"
  # helm's own main package, built from its module with its version stamped
  # in (what `helm version` and the chart's kubeVersion checks read)
  (cd "$mod" && go mod init toposerve.local/helm >/dev/null 2>&1 \
     && go get "helm.sh/helm/v4@$HELM_VERSION" \
     && go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
          -o "$mod/helm.out" helm.sh/helm/v4/cmd/helm)
  mkdir -p "$dir"; mv "$mod/helm.out" "$dir/helm"
}

start=$(date +%s)
build_helm
build_kwok
build_etcd
build_kubernetes
say "done in $(( $(date +%s) - start ))s; binaries in $BIN"
ls -l "$BIN"/*/ >&2
