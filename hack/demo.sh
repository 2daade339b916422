#!/usr/bin/env bash
# make demo: see hack/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python hack/demo.py
