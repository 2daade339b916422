"""Moving a claim's NICs into a pod's network namespace and back, with a
journal written before every step, so a crash at any point leaves each
interface in the pod or on the host, and the next call finishes the job.

The rules, for whoever holds the journal lock (one mover at a time, so any
entry that is not ``Attached`` was left by a mover that died):
- ``attach`` of a NIC for sandbox S: an entry of another sandbox is first
  taken back (unless it is ``Attached`` to a namespace that still exists:
  then the NIC is busy); then move it in, rename, configure, ``Attached``.
- ``detach`` of an entry: ``Detaching``, then reset and move back under the
  host name with the host MTU, down, no addresses; then drop the entry.
- ``repair``: every entry a dead mover left (``Attaching`` is undone,
  ``Detaching`` finished) and every ``Attached`` entry whose namespace is
  gone (the kernel returns a physical NIC to the host) is detached.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from toposerve.dra_driver.net.config import NetConfig
from toposerve.dra_driver.net.handoff.journal import Entry, Journal, Step
from toposerve.dra_driver.net.handoff.links import Link, Namespace

log = structlog.get_logger("toposerve.net.handoff")


class HandoffError(RuntimeError):
    """A NIC could not be handed over; the message names it and why."""


@dataclass(frozen=True)
class Attached:
    host_name: str
    pod_name: str
    mac: str
    config: NetConfig


def pod_name(host_ifname: str, config: NetConfig) -> str:
    return config.interface_name or host_ifname


def _netns_exists(path: str) -> bool:
    return os.path.exists(path)


def _configure(pod: Namespace, link: Link, config: NetConfig) -> Link:
    pod.set_link(link, mtu=config.mtu)
    link = pod.get(link.index)
    pod.set_addresses(link, config.addresses)
    pod.set_link(pod.get(link.index), up=True)
    link = pod.get(link.index)
    pod.set_routes(link, config.routes)
    return link


class Mover:
    """Hand-offs through one journal, from the host namespace (ours)."""

    def __init__(self, journal: Journal, host_netns: str | None = None) -> None:
        """``host_netns``: where NICs live when not in a pod (None: our own
        namespace; tests give one they made)."""
        self.journal = journal
        self._host_path = host_netns
        self._host: Namespace | None = None
        self._pods: dict[str, Namespace] = {}  # opening one costs pyroute2 ~25 ms

    @property
    def host(self) -> Namespace:
        if self._host is None:
            self._host = Namespace(self._host_path)
        return self._host

    def close(self) -> None:
        for ns in self._pods.values():
            ns.close()
        self._pods.clear()
        if self._host is not None:
            self._host.close()
            self._host = None

    def _pod(self, path: str) -> Namespace:
        if path not in self._pods:
            self._pods[path] = Namespace(path)
        return self._pods[path]

    def _in_pod(self, entry: Entry) -> tuple[Namespace, Link] | None:
        """The pod's namespace and the link, if the link is in there."""
        if not _netns_exists(entry.netns):
            stale = self._pods.pop(entry.netns, None)
            if stale is not None:
                stale.close()
            return None
        pod = self._pod(entry.netns)
        link = pod.find(entry.podIfName, entry.mac)
        return None if link is None else (pod, link)

    def attach(self, sandbox: str, netns: str, host_ifname: str,
               config: NetConfig) -> Attached:
        """Move ``host_ifname`` into ``netns`` configured by ``config``;
        running it again (after a crash, or twice) ends in the same place."""
        if not _netns_exists(netns):
            raise HandoffError(f"{host_ifname}: network namespace {netns} does not exist")
        entry = self.journal.read(host_ifname)
        if entry is not None and entry.sandbox != sandbox:
            if entry.step == Step.ATTACHED and _netns_exists(entry.netns):
                raise HandoffError(f"{host_ifname} is in use by pod sandbox {entry.sandbox}")
            self.detach(entry)
            entry = None
        if entry is not None and entry.step == Step.DETACHING:
            self.detach(entry)
            entry = None
        want = pod_name(host_ifname, config)
        if entry is None:
            link = self.host.find(host_ifname)
            if link is None:
                raise HandoffError(f"{host_ifname} is not on the host (nor journalled as "
                                   "in a pod): is the driver's record stale?")
            entry = Entry(hostIfName=host_ifname, podIfName=want, mac=link.mac,
                          hostMtu=link.mtu, sandbox=sandbox, netns=netns, config=config,
                          step=Step.ATTACHING)
            self.journal.write(entry)
        elif entry.config != config or entry.podIfName != want:
            # the same sandbox with another config (a re-prepared claim): undo, redo
            self.detach(entry)
            return self.attach(sandbox, netns, host_ifname, config)
        found = self._in_pod(entry)
        if found is None:
            link = self.host.find(entry.hostIfName, entry.mac)
            if link is None:
                raise HandoffError(f"{host_ifname} (mac {entry.mac}) is neither on the host "
                                   f"nor in {netns}")
            target = self._pod(netns)
            if target.find(want) is not None:  # the kernel would move it, then fail the rename
                raise HandoffError(f"{host_ifname}: {netns} already has an interface "
                                   f"named {want}; set another interfaceName")
            self.host.move(link, target, want)
            found = self._in_pod(entry)
            if found is None:
                raise HandoffError(f"{host_ifname} did not arrive in {netns} as {want}")
        pod, link = found
        if link.name != want:
            pod.set_link(link, name=want)
            link = pod.get(link.index)
        _configure(pod, link, config)
        if entry.step != Step.ATTACHED:
            self.journal.write(entry.model_copy(update={"step": Step.ATTACHED}))
        log.info("nic attached", nic=host_ifname, pod_ifname=want, sandbox=sandbox)
        return Attached(host_name=host_ifname, pod_name=want, mac=entry.mac, config=config)

    def detach(self, entry: Entry) -> bool:
        """Bring the entry's NIC back to the host (host name, host MTU, down,
        no addresses) and drop the entry. False if the NIC was nowhere to be
        found (a virtual link deleted with its namespace)."""
        if entry.step != Step.DETACHING:
            entry = entry.model_copy(update={"step": Step.DETACHING})
            self.journal.write(entry)
        found = self._in_pod(entry)
        if found is not None:
            pod, link = found
            pod.set_link(link, up=False, mtu=entry.hostMtu)
            pod.set_addresses(pod.get(link.index), ())
            pod.move(link, self.host, entry.hostIfName)
        back = self.host.find(entry.hostIfName, entry.mac)
        if back is None:
            log.error("nic lost", nic=entry.hostIfName, mac=entry.mac, netns=entry.netns)
            self.journal.remove(entry.hostIfName)
            return False
        self.host.set_link(back, name=entry.hostIfName, mtu=entry.hostMtu, up=False)
        self.host.set_addresses(self.host.get(back.index), ())
        self.journal.remove(entry.hostIfName)
        log.info("nic detached", nic=entry.hostIfName, sandbox=entry.sandbox)
        return True

    def detach_sandbox(self, sandbox: str) -> list[str]:
        """Every NIC journalled for the sandbox back to the host (CNI DEL);
        needs no record. Returns the host names brought back."""
        back = []
        for entry in self.journal.entries():
            if entry.sandbox == sandbox and self.detach(entry):
                back.append(entry.hostIfName)
        return back

    def repair(self, keep: Callable[[Entry], bool] = lambda e: False) -> list[str]:
        """Finish or undo what a dead mover left (entries ``keep`` spares
        aside); returns the host names dealt with."""
        done = []
        for entry in self.journal.entries():
            stale = entry.step != Step.ATTACHED or not _netns_exists(entry.netns)
            if stale and not keep(entry):
                # Every pod's ADD (the plugin is chained after the pod network)
                # and the driver's start repair first: one NIC that cannot come
                # home (its host name taken, say) must fail only its own pod's
                # calls, not all of them. Its entry stays for the next try.
                try:
                    self.detach(entry)
                except Exception as err:
                    log.error("nic could not be brought back; will retry",
                              nic=entry.hostIfName, sandbox=entry.sandbox,
                              error=f"{type(err).__name__}: {err}")
                    continue
                done.append(entry.hostIfName)
        return done


def repair_journal(journal: Journal, host_netns: str | None = None) -> list[str]:
    """The driver's start-up repair: under the lock, what dead movers left
    is finished or undone (``Mover.repair``); NICs attached to live pods stay."""
    mover = Mover(journal, host_netns)
    try:
        with journal.lock():
            return mover.repair()
    finally:
        mover.close()
