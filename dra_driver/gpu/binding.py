"""The GPU driver's binding conditions (``kubeletplugin.binding``): with
them on, a GPU on an NVLink fabric (GB200-class: NVML reports a fabric for
it) is published with them, and a pod whose claim got it binds to the node
only once the GPU has registered with the fabric manager; a registration
that failed sends the pod back to scheduling.

Condition types in the driver's own domain: ``gpu.toposerve.io/FabricReady``
(True: bind) and ``gpu.toposerve.io/FabricFailed`` (True: back to
scheduling).
"""

from __future__ import annotations

from toposerve.dra_driver.gpu.devices import DRIVER
from toposerve.dra_driver.gpu.nvml import Fabric
from toposerve.dra_driver.kubeletplugin.binding import BindingConditions, Readiness, State

CONDITIONS = BindingConditions(ready=f"{DRIVER}/FabricReady", failed=f"{DRIVER}/FabricFailed")
FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
_UNDERWAY = {1: "has not started", 2: "is in progress"}


def fabric_readiness(gpu: str, fabric: Fabric | None, problem: str = "") -> Readiness:
    """Ready: registered with the fabric. Pending: registration not started
    or in progress. Failed: registration completed with an error, the GPU
    unhealthy or unreadable (``problem``), or no fabric any more."""
    if problem:
        return Readiness(State.FAILED, "GpuUnavailable", f"{gpu}: {problem}")
    if fabric is None:
        return Readiness(State.FAILED, "NoFabric", f"{gpu} reports no NVLink fabric")
    if fabric.state == FABRIC_COMPLETED:
        if fabric.status == 0:
            return Readiness(State.READY, "FabricRegistered",
                             f"{gpu} is registered with the NVLink fabric")
        return Readiness(State.FAILED, "FabricRegistrationFailed",
                         f"{gpu}: NVLink fabric registration failed: {fabric.error}")
    return Readiness(State.PENDING, "FabricRegistering",
                     f"{gpu}: NVLink fabric registration "
                     f"{_UNDERWAY.get(fabric.state, f'is in state {fabric.state}')}")
