#!/usr/bin/env bash
# Debian packages the tests need: redis-server (the router's hot-standby
# responses store is tested against a real one). Idempotent.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "install-system-deps: need root to install ${need[*]} (apt-get install ${need[*]})" >&2
  exit 1
fi
echo "install-system-deps: installing ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
