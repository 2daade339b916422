#!/usr/bin/env bash
# The main job as it stands: bring up a real local cluster with a mix of
# hardware profiles, show the topology it created, tear it down.
set -euo pipefail
cd "$(dirname "$0")/.."
ts=.venv/bin/toposerve
name=demo
trap '$ts cluster down --name $name >/dev/null 2>&1 || true' EXIT
$ts cluster down --name $name >/dev/null 2>&1 || true
$ts cluster up --name $name --profile hgx-h100=8 --profile gb200-nvl72=36 --profile mi300x=4
echo
$ts topology show --name $name
echo
echo "one hgx-h100 node inside:"
$ts topology show --profile hgx-h100
echo
$ts cluster status
