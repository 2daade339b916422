"""The NIC driver's binding conditions (``kubeletplugin.binding``): with
them on, a pod whose claim got a NIC binds to the node only once the
driver there has seen that NIC ready, i.e. present with its link up.

Condition types in the driver's own domain, so they never meet another
driver's or a future Kubernetes one in a claim's status:
``net.toposerve.io/LinkReady`` (True: bind) and
``net.toposerve.io/LinkFailed`` (True: back to scheduling).
"""

from __future__ import annotations

from toposerve.dra_driver.kubeletplugin.binding import BindingConditions, Readiness, State
from toposerve.dra_driver.net.devices import DRIVER
from toposerve.dra_driver.net.discovery import Nic

CONDITIONS = BindingConditions(ready=f"{DRIVER}/LinkReady", failed=f"{DRIVER}/LinkFailed")
# operstates of a link that carries traffic; "unknown" is what drivers
# without carrier reporting (and loopback) show while they work
CARRYING = frozenset({"up", "unknown"})


def link_readiness(nic: Nic | None, present: bool = True) -> Readiness:
    """Ready: published, its PCI function on the bus, its link brought up
    and carrying. Failed: gone, or up without carrier (cable, switch port,
    the fabric end down). Pending: not brought up yet, or still in the pod
    that had it (nothing is wrong yet; the binding timeout still runs)."""
    if nic is None or not present:
        what = nic.pci.bdf if nic is not None and nic.pci is not None else "the NIC"
        return Readiness(State.FAILED, "NicGone", f"{what} is no longer on this node")
    link = nic.link
    if link is None:
        return Readiness(State.PENDING, "NicAway",
                         f"{nic.if_name} is still in another pod's network namespace")
    if not link.admin_up:
        return Readiness(State.PENDING, "LinkNotUp",
                         f"{link.name} is not brought up (ip link set {link.name} up)")
    if link.state in CARRYING:
        return Readiness(State.READY, "LinkUp", f"{link.name} is up")
    return Readiness(State.FAILED, "LinkDown",
                     f"{link.name} is up but has no carrier (operstate {link.state})")
