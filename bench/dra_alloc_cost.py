"""What one node costs the scheduler's DRA Filter (kube-scheduler 1.37.2's
allocator, run alone by the Go program in ``bench/dra_alloc``), with the
GPU driver's slice of an hgx-h100 node (whole GPUs, as ``driver simulate``
publishes it) alone and beside NIC slice shapes: the NIC driver's as
published, without the node-level attributes, and cut to 8 attributes (a
floor no user could keep). On a node with a free GPU and on one whose GPUs
are all allocated (docs/scale.md, NIC slices).

    .venv/bin/python -m bench.dra_alloc_cost --runs 3

Needs Go and the module cache (or a proxy) for k8s.io/dynamic-resource-allocation v0.37.2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from toposerve.dra_driver.gpu.devices import DRIVER as GPU_DRIVER
from toposerve.dra_driver.net.devices import DRIVER as NET_DRIVER
from toposerve.dra_driver.simulate import POOLS, SimNode
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import load_profile

GO = Path(__file__).resolve().parent / "dra_alloc"
NODE_LEVEL = ("zone", "block", "rack", "nvlinkDomain")  # the node's labels, on every device


def shapes() -> dict[str, Any]:
    """One hgx-h100 node's whole GPUs, and its NICs in each shape compared."""
    path = DomainPath(zone="z0", block="b0", rack="r0", nvlink="r0-n0", host="node-000")
    topo = NodeTopology(name="node-000", path=path, profile="hgx-h100",
                        hardware=load_profile("hgx-h100").hardware())
    node = SimNode(name="node-000", uid="u", profile="hgx-h100", path=path, partitions=False)
    gpu = [dict(d) for d in POOLS[GPU_DRIVER](topo, node).devices]
    nic = json.loads(json.dumps(POOLS[NET_DRIVER](topo, node).devices))
    bare = [{**d, "attributes": {k: v for k, v in d["attributes"].items()
                                 if k not in NODE_LEVEL}} for d in nic]
    eight = [{**d, "attributes": dict(list(d["attributes"].items())[:8])} for d in nic]
    return {"gpu": gpu, "shapes": {f"nic ({len(nic[0]['attributes'])} attributes)": nic,
                                   f"nic without {', '.join(NODE_LEVEL)}": bare,
                                   "nic cut to 8 attributes": eight}}


def run_once(data: Path, rounds: int) -> dict[str, dict[str, float]]:
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    out = subprocess.run(["go", "run", ".", "-rounds", str(rounds), str(data)], cwd=GO,
                         env=env, capture_output=True, text=True, timeout=900, check=True)
    got: dict[str, dict[str, float]] = json.loads(out.stdout)
    return got


def table(runs: list[dict[str, dict[str, float]]]) -> str:
    """Median over the runs of µs per node, and each against the GPU driver alone."""
    base = {k: statistics.median(r[""][k] for r in runs) for k in ("free", "full")}
    lines = ["| slices of a node | free GPUs µs | vs GPU alone | GPUs all allocated µs | "
             "vs GPU alone |", "|---|---:|---:|---:|---:|"]
    for name in runs[0]:
        free = statistics.median(r[name]["free"] for r in runs)
        full = statistics.median(r[name]["full"] for r in runs)
        label = name or "GPU driver alone (8 whole GPUs)"
        lines.append(f"| {label} | {free:.1f} | {free / base['free']:.2f} | {full:.1f} | "
                     f"{full / base['full']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of the Go program (median)")
    ap.add_argument("--rounds", type=int, default=60, help="passes over 200 nodes per run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "devices.json"
        data.write_text(json.dumps(shapes()))
        runs = [run_once(data, args.rounds) for _ in range(args.runs)]
    print(table(runs))


if __name__ == "__main__":
    main()
