"""Publishing a driver's devices as ResourceSlices: what Go drivers get from
``k8s.io/dynamic-resource-allocation/resourceslice``. The controller
(``publisher``) turns desired pools into the fewest API writes; what to
write is decided by pure functions (``slice_plan``)."""

from toposerve.dra_driver.resourceslice.publisher import ReconcileStats, SlicePublisher
from toposerve.dra_driver.resourceslice.slice_plan import Pool

__all__ = ["Pool", "ReconcileStats", "SlicePublisher"]
