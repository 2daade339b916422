#!/usr/bin/env bash
# The Gateway API Inference Extension conformance suite
# (sigs.k8s.io/gateway-api-inference-extension/conformance), built from the Go
# module proxy as a test binary into the tools cache, keyed by version; the
# version is the InferencePool CRD's pin (toposerve.localcluster.crds), so the
# suite and the CRD the local cluster installs always agree.
#
#   hack/epp-conformance.sh build          the binary's path (built once a version)
#   hack/epp-conformance.sh gateway-crds   the Gateway API standard CRDs' folder, of
#                                          the version the suite is built with
#   hack/epp-conformance.sh source         the suite's source folder (its tests/*.go)
#   hack/epp-conformance.sh run [FLAGS]    the suite against $KUBECONFIG; FLAGS are
#                                          the suite's own (--gateway-class=NAME,
#                                          --run-test=NAME, --skip-tests=..., ...)
#
# docs/endpoint-picker.md (Conformance) says which tests run where, and why.
set -euo pipefail

TOOL_LOG_NAME=epp-conformance
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=go-build-env.sh
source "$ROOT/hack/go-build-env.sh"

PY="${PYTHON:-$ROOT/.venv/bin/python}"
VERSION="${GIE_VERSION:-$("$PY" -c 'from toposerve.localcluster.crds import INFERENCE_POOL; print(INFERENCE_POOL.version)')}"
MODULE=sigs.k8s.io/gateway-api-inference-extension/conformance
MOD="$SRC/gie-conformance-$VERSION"
OUT="$BIN/gie-conformance-$VERSION/gie-conformance.test"

module_dir() {
  # a module of ours that imports the suite at the pinned version; the
  # suite's go.mod points its parent module at ../, which only holds in
  # upstream's work tree, so ours requires both from the proxy
  if [[ -f "$MOD/go.sum" ]] && grep -q "^$MODULE $VERSION " "$MOD/go.sum"; then return; fi
  rm -rf "$MOD"; mkdir -p "$MOD"
  cat >"$MOD/go.mod" <<GO
module toposerve.local/gie-conformance

go 1.26.0

require $MODULE $VERSION
GO
  cat >"$MOD/conformance_test.go" <<'GO'
// The suite's own entry point, unchanged, as a test binary.
package giec

import (
	"testing"

	"sigs.k8s.io/gateway-api-inference-extension/conformance"
)

func TestConformance(t *testing.T) { conformance.RunConformance(t) }
GO
  (cd "$MOD" && go mod tidy) || die "cannot fetch $MODULE@$VERSION from the Go module proxy (GOPROXY=$(go env GOPROXY))"
}

build() {
  if [[ -x "$OUT" ]]; then say "conformance $VERSION: cached"; echo "$OUT"; return; fi
  module_dir
  say "conformance $VERSION: building the test binary (some minutes the first time)"
  mkdir -p "$(dirname "$OUT")"
  (cd "$MOD" && nice -n 10 go test -c -trimpath -o "$OUT.part" .)
  mv "$OUT.part" "$OUT"
  echo "$OUT"
}

module_path() {
  module_dir
  (cd "$MOD" && go mod download "$1" && go list -m -f '{{.Dir}}' "$1")
}

gateway_crds() {
  local dir
  dir="$(module_path sigs.k8s.io/gateway-api)"
  [[ -d "$dir/config/crd/standard" ]] || die "no config/crd/standard in $dir"
  echo "$dir/config/crd/standard"
}

case "${1:-}" in
  build) build ;;
  gateway-crds) gateway_crds ;;
  source) module_path "$MODULE" ;;
  run)
    shift
    bin="$(build)"
    # the suite finds its manifests in the binary (embedded); -test.run keeps
    # to its one entry point
    exec "$bin" -test.v -test.run '^TestConformance$' "$@"
    ;;
  *) die "usage: $0 build | gateway-crds | source | run [suite flags]" ;;
esac
