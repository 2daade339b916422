#!/usr/bin/env bash
# make demo: see hack/demo.py. The repository root on the path: the demo
# uses harness/ (simulators and routers as processes), which is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python hack/demo.py
