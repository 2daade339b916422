"""A claim's GpuConfig ``env`` (written by the pod's author) may add
variables, never replace the ones the driver derives from the allocation:
the visible-devices lists (which GPUs a container runtime or CUDA uses)
and the TOPOSERVE_* facts (a memory share's size among them). CDI edits
override the pod's own env, so without this a claim could turn
``NVIDIA_VISIBLE_DEVICES`` into ``all`` or another GPU's UUID."""

from __future__ import annotations

from pathlib import Path

import pytest

from toposerve.dra_driver.gpu.config import GpuConfig
from toposerve.dra_driver.gpu.devices import gpu_pool
from toposerve.dra_driver.gpu.edits import gpu_edits, resolve
from toposerve.dra_driver.kubeletplugin import parse_opaque
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import load_profile

CFG = {"apiVersion": "gpu.toposerve.io/v1", "kind": "GpuConfig"}


@pytest.mark.parametrize("name", [
    "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "AMD_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "TOPOSERVE_GPU_MEMORY_BYTES",
    "TOPOSERVE_NICS", "TOPOSERVE_GPU_PCI_BUS_IDS",
])
def test_a_claim_cannot_replace_what_the_driver_sets(name: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_opaque({**CFG, "env": {name: "all"}}, GpuConfig)
    assert f"env: Value error, set by the driver, not by a config: {name}" in str(err.value)


def test_the_edits_keep_the_allocated_gpus_whatever_the_config(tmp_path: Path) -> None:
    node = NodeTopology(name="n1", path=DomainPath(host="n1", rack="r1"), profile="hgx-h100",
                        hardware=load_profile("hgx-h100").hardware())
    pool = {d["name"]: d for d in gpu_pool(node).devices}
    for n in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (tmp_path / n).touch()
    # a config built past validation (a class's, an older record) is still not obeyed
    cfg = GpuConfig.model_construct(topology_env=True, nic_alignment="switch",
                                    env={"NVIDIA_VISIBLE_DEVICES": "all", "NCCL_DEBUG": "INFO"})
    edits = gpu_edits(resolve(["gpu-0"], pool, node.hardware), node.hardware, cfg, tmp_path)
    uuid = pool["gpu-0"]["attributes"]["uuid"]["string"]
    assert edits.common.env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert edits.common.env["CUDA_VISIBLE_DEVICES"] == uuid
    assert edits.common.env["NCCL_DEBUG"] == "INFO"


def test_other_variables_still_pass() -> None:
    cfg = parse_opaque({**CFG, "env": {"NCCL_DEBUG": "INFO", "MY_VISIBLE": "x"}}, GpuConfig)
    assert cfg.env == {"NCCL_DEBUG": "INFO", "MY_VISIBLE": "x"}
