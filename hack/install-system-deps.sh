#!/usr/bin/env bash
# Debian packages the tests need: redis-server (the router's hot-standby
# responses store is tested against a real one); for the real node (docs/design.md
# §9) runc, a static busybox for test images and openssl for the kubelet's
# client certificate; for `make image` (docs/image.md) buildah and mmdebstrap.
# Idempotent.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v runc >/dev/null 2>&1 || need+=(runc)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "install-system-deps: need root to install ${need[*]} (apt-get install ${need[*]})" >&2
  exit 1
fi
echo "install-system-deps: installing ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
