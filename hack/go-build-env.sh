# Sourced by the hack/build-*-tools.sh scripts: the version pins, the
# version-keyed cache outside the repository, and the Go environment they
# all build with. The caller sets TOOL_LOG_NAME first (its log prefix).
# shellcheck shell=bash

# shellcheck source=../localcluster/versions.env
source "$(dirname "${BASH_SOURCE[0]}")/../localcluster/versions.env"
CACHE="${TOPOSERVE_CACHE:-$HOME/.cache/toposerve}"
BIN="$CACHE/bin"
SRC="$CACHE/src"

say() { printf '[%s] %s\n' "$TOOL_LOG_NAME" "$*" >&2; }
die() { say "error: $*"; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed (need go >= 1.26 on PATH; see https://go.dev/doc/install)"
export GOFLAGS=-mod=mod CGO_ENABLED=0
# k8s.io/kubernetes asks for the machine's Go; fall back to the one newer
# toolchain the module proxy offers if a module needs more.
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"

mkdir -p "$BIN" "$SRC"
