#!/usr/bin/env bash
# Issue 45's scaling run, for a machine with cores to spare (the 16-core GPU
# machine; no GPU used): requests/s, added p50/p99 of our router with 1, 2
# and 4 workers, and of smg, sglang-router and vllm-router on the same 1, 2
# and 4 cores, at 64-512 closed-loop clients over 4 null endpoints, in one
# run (bench.router_overhead --cores). The routers get the first cores, the
# clients (spread over processes, as one Python client process saturates
# first) and the null backends the rest, so the two never share a core.
#
#   hack/bench-cores.sh                       JSON/MD/PNG: bench/results/router_overhead_cores.*
#   CORES="1 2" REQUESTS=300 REPEATS=1 CONCURRENCY="64 128" hack/bench-cores.sh  # a smoke run
#
# ROUTER_CPUS and CLIENT_CPUS (space-separated CPU numbers) override the
# split; CLIENT_PROCS the client processes (default: one per client CPU, at most 8).
# Needs `make setup peers` (.venv and .venv-peers).
set -euo pipefail
cd "$(dirname "$0")/.."
CORES=${CORES:-"1 2 4"}
most=0
for n in $CORES; do (( n > most )) && most=$n; done
cpus=$(nproc)
ROUTER_CPUS=${ROUTER_CPUS:-$(seq -s ' ' 0 $((most - 1)))}
if [[ -z ${CLIENT_CPUS:-} ]]; then
    if (( cpus <= most )); then
        echo "error: $cpus CPUs leave none for the clients beside $most router cores;" \
             "set CLIENT_CPUS (sharing them) or fewer CORES" >&2
        exit 2
    fi
    CLIENT_CPUS=$(seq -s ' ' "$most" $((cpus - 1)))
fi
clients=$(wc -w <<<"$CLIENT_CPUS")
CLIENT_PROCS=${CLIENT_PROCS:-$(( clients < 8 ? clients : 8 ))}
# shellcheck disable=SC2086  # the lists are word-split on purpose
exec .venv/bin/python -m bench.router_overhead --cores $CORES \
    --router-cpu $ROUTER_CPUS --client-cpu $CLIENT_CPUS --client-procs "$CLIENT_PROCS" \
    --requests "${REQUESTS:-4000}" --repeats "${REPEATS:-3}" \
    --concurrency ${CONCURRENCY:-64 128 256 512} --out "${OUT:-bench/results}"
