#!/usr/bin/env bash
# Builds the install's images without a registry (`make image`): OCI archives
# in the tool cache, keyed by a hash of their inputs, so an unchanged image is
# not rebuilt. Prints "<reference> <archive>" per image on stdout.
#   localhost/toposerve:<pyproject version>  Containerfile (product + toposerve-nic)
#   localhost/kube-scheduler:<K8S_VERSION>   hack/images/kube-scheduler.Containerfile
#   localhost/redis:<Debian's redis version> hack/images/redis.Containerfile
# Builder: buildah (Debian's), overlay storage of its own under the cache,
# chroot isolation; no RUN step needs the network. The Debian bases are made by
# mmdebstrap from Debian's mirror, the only download besides the Python wheels
# (pip download on the host; the image build installs from them offline).
# Usage: hack/build-image.sh NIC_BINARY      (the Makefile passes `make nic-cni`'s)
# Env: TOPOSERVE_IMAGE_BASE=<image> builds the toposerve image on that Python
# base (pulled) instead of the Debian one, TOPOSERVE_IMAGE_BUILD_BASE its build
# stage on another (with binutils; default: TOPOSERVE_IMAGE_BASE); DEBIAN_MIRROR,
# DEBIAN_SUITE.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../localcluster/versions.env
source "$ROOT/localcluster/versions.env"
CACHE="${TOPOSERVE_CACHE:-$HOME/.cache/toposerve}"
IMAGES="$CACHE/images"
PY="${PY:-$ROOT/.venv/bin/python}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org}"
SCHEDULER_BIN="$CACHE/bin/kubernetes-$K8S_VERSION/kube-scheduler"
SELF_HASH="$(sha256sum "$0" | cut -c1-64)"

say() { printf '[build-image] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

[[ $# -eq 1 && -x "$1" ]] || die "usage: $0 NIC_BINARY (the toposerve-nic that \`make nic-cni\` builds)"
NIC="$1"
[[ $(id -u) -eq 0 ]] || die "needs root (buildah with overlay storage, mmdebstrap)"
for t in buildah mmdebstrap; do
  command -v "$t" >/dev/null || die "$t is not installed: make sysdeps (apt-get install buildah mmdebstrap)"
done

mkdir -p "$IMAGES"
exec 9>"$IMAGES/.lock"
flock 9  # one build at a time: they share the storage and the archives
# buildah's own storage, apart from the machine's (its images are ours only)
BUILDAH=(buildah --root "$CACHE/containers/storage" --runroot /run/toposerve-buildah
         --storage-driver overlay)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# sha256 of its arguments: strings, and files or directories (names and bytes)
key() {
  local a
  for a in "$@"; do
    if [[ -d $a ]]; then
      (cd "$a" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum)
    elif [[ -f $a ]]; then sha256sum <"$a"
    else printf '%s\n' "$a"
    fi
  done | sha256sum | cut -c1-16
}

# A Debian root filesystem with these packages, from Debian's mirror: the
# Essential set and their dependencies (no apt: images are built, not patched;
# merged /usr; no docs, man pages or locales), imported as an image
# labelled io.toposerve.debian.<package>=<version>; cached under a hash of the
# recipe. Prints the image name.
debian_base() {
  local name=$1; shift
  local opts=(--variant=essential "--include=$(IFS=,; echo "$*")"
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --aptopt='Acquire::Languages "none"'
    --customize-hook='rm -rf "$1"/var/lib/apt "$1"/var/cache/apt "$1"/var/log/*')
  local sources=("deb $MIRROR/debian $SUITE main" "deb $MIRROR/debian $SUITE-updates main"
                 "deb $MIRROR/debian-security $SUITE-security main")
  local image; image="localhost/toposerve-base/$name:$SUITE-$(key "${opts[@]}" "${sources[@]}")"
  if ! "${BUILDAH[@]}" inspect --type image "$image" >/dev/null 2>&1; then
    say "base $image: mmdebstrap $SUITE + $* (Debian's mirror)"
    nice -n 10 mmdebstrap "${opts[@]}" "$SUITE" "$WORK/$name.tar" "${sources[@]}" \
      >"$WORK/mmdebstrap.log" 2>&1 || { tail -n 20 "$WORK/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
    local labels=() p
    for p in "$@"; do
      labels+=(--label "io.toposerve.debian.$p=$(tar -xOf "$WORK/$name.tar" ./var/lib/dpkg/status \
        | awk -v p="$p" '$1 == "Package:" {hit = $2 == p} hit && $1 == "Version:" {print $2; exit}')")
    done
    local c; c="$("${BUILDAH[@]}" from scratch)"
    "${BUILDAH[@]}" add "$c" "$WORK/$name.tar" / >/dev/null
    "${BUILDAH[@]}" config "${labels[@]}" --cmd /bin/sh \
      --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
    "${BUILDAH[@]}" commit --quiet --rm "$c" "$image" >/dev/null
    rm -f "$WORK/$name.tar"
  fi
  echo "$image"
}

# Builds ref from a Containerfile unless images/<name>-<key>.oci.tar exists,
# then writes it there; prints "ref archive".
image() {
  local name=$1 ref=$2 k=$3 file=$4 ctx=$5; shift 5
  local out="$IMAGES/$name-$k.oci.tar"
  if [[ -f $out ]]; then
    say "$ref: cached ($out)"
  else
    local start=$SECONDS
    say "$ref: building from ${file#"$ROOT"/}"
    nice -n 10 "${BUILDAH[@]}" bud --quiet --isolation chroot \
      -f "$file" -t "$ref" "$@" "$ctx" >&2
    rm -f "$IMAGES/$name"-*.oci.tar  # the cache keeps the current build only
    nice -n 10 "${BUILDAH[@]}" push --quiet "$ref" "oci-archive:$out.tmp:$ref" >&2
    mv "$out.tmp" "$out"
    "${BUILDAH[@]}" rmi "$ref" >/dev/null
    say "$ref: written in $((SECONDS - start))s ($out)"
  fi
  echo "$ref $out"
}

# The runtime dependencies as wheels (and the build backend), downloaded from
# the package index once per requirements and base, so the image build installs
# offline. Resolved by the base's own Python: markers such as
# python_full_version must see its version, not the host's.
wheelhouse() {
  local base=$1 reqs="$WORK/requirements.txt"
  # the extras the Containerfile installs (its ARG EXTRAS)
  "$PY" - "$ROOT/pyproject.toml" "$(sed -n 's/^ARG EXTRAS=//p' "$ROOT/Containerfile")" >"$reqs" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))
extras = [r for e in sys.argv[2].split(",") for r in p["project"]["optional-dependencies"][e]]
print("\n".join(p["project"]["dependencies"] + extras + p["build-system"]["requires"]))
PY
  local dir; dir="$CACHE/wheels/$(key "$reqs" "$base")"
  if [[ ! -f $dir/.complete ]]; then
    say "wheels: pip download in $base into $dir"
    rm -rf "$dir"; mkdir -p "$dir"
    local c; c="$("${BUILDAH[@]}" from --quiet "${pull[@]}" "$base")"
    # the host's CA bundle: the index may be reached through the host's proxy
    nice -n 10 "${BUILDAH[@]}" run --isolation chroot -v "$dir:/wheels" -v "$reqs:/reqs.txt:ro" \
      -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/host-ca.crt:ro \
      --env PIP_CERT=/etc/ssl/host-ca.crt --env PIP_DISABLE_PIP_VERSION_CHECK=1 "$c" -- \
      sh -c 'python3 -m venv /tmp/pip && /tmp/pip/bin/pip download --quiet --only-binary=:all: \
             --dest /wheels -r /reqs.txt' >&2 || { "${BUILDAH[@]}" rm "$c" >/dev/null; exit 1; }
    "${BUILDAH[@]}" rm "$c" >/dev/null
    touch "$dir/.complete"
  fi
  echo "$dir"
}

# The build context of the toposerve image: pyproject.toml, README.md and the
# product's packages (what git tracks or would, so no caches or build output),
# the wheels and toposerve-nic; what the Containerfile reads, nothing else.
stage_toposerve() {
  local ctx=$1 wheels=$2
  local pkgs
  mapfile -t pkgs < <("$PY" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))
print("\n".join(sorted(set(p["tool"]["setuptools"]["package-dir"].values()))))
PY
)
  mkdir -p "$ctx/src"
  (cd "$ROOT" && git ls-files -co --exclude-standard -- pyproject.toml README.md "${pkgs[@]}" \
     | while IFS= read -r f; do [[ -f $f ]] && printf '%s\0' "$f"; done \
     | xargs -0 cp --parents -t "$ctx/src")
  cp -r "$wheels" "$ctx/wheels"; rm -f "$ctx/wheels/.complete"
  cp "$NIC" "$ctx/toposerve-nic"
}

version="$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$ROOT/pyproject.toml")"

# toposerve
if [[ -n ${TOPOSERVE_IMAGE_BASE:-} ]]; then
  py_base=$TOPOSERVE_IMAGE_BASE; build_base=${TOPOSERVE_IMAGE_BUILD_BASE:-$py_base}; pull=()
else
  # manylinux wheels (grpcio, tokenizers) use the system's libstdc++
  py_base="$(debian_base python3 python3 python3-venv libstdc++6)"; pull=(--pull-never)
  # the same Python, and binutils for the build stage's strip
  build_base="$(debian_base python3-build python3 python3-venv libstdc++6 binutils)"
fi
ctx="$WORK/toposerve"
stage_toposerve "$ctx" "$(wheelhouse "$py_base")"
image toposerve "localhost/toposerve:$version" \
  "$(key "$SELF_HASH" "$py_base" "$build_base" "$ROOT/Containerfile" "$ctx")" \
  "$ROOT/Containerfile" "$ctx" --build-arg "BASE=$py_base" --build-arg "BUILD_BASE=$build_base" \
  --build-arg PIP_NO_INDEX=1 "${pull[@]}"

# Redis: Debian's redis-server, already in its base
redis_base="$(debian_base redis redis-server)"
redis_version="$("${BUILDAH[@]}" inspect --type image \
  --format '{{index .OCIv1.Config.Labels "io.toposerve.debian.redis-server"}}' "$redis_base")"
redis_version="${redis_version#*:}"; redis_version="${redis_version%%[-+]*}"
file="$ROOT/hack/images/redis.Containerfile"
mkdir -p "$WORK/redis"
image redis "localhost/redis:$redis_version" \
  "$(key "$SELF_HASH" "$file" "$redis_base")" "$file" "$WORK/redis" --build-arg "BASE=$redis_base" --pull-never

# the second scheduler: upstream's static binary alone
[[ -x "$SCHEDULER_BIN" ]] || die "no kube-scheduler at $SCHEDULER_BIN: make tools"
ctx="$WORK/kube-scheduler"
mkdir -p "$ctx"; cp "$SCHEDULER_BIN" "$ctx/kube-scheduler"
file="$ROOT/hack/images/kube-scheduler.Containerfile"
image kube-scheduler "localhost/kube-scheduler:$K8S_VERSION" \
  "$(key "$SELF_HASH" "$file" "$ctx")" "$file" "$ctx"
