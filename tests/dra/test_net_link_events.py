"""Rescans on netlink events: the debounce (pure, a fake clock) and the
watch against real netlink in a namespace the test makes (a veth pair
added, then a burst of changes: one rescan each, promptly)."""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from collections.abc import Iterator

import pytest

from harness.waiting import wait_for
from toposerve.dra_driver.net.link_events import Debounce, LinkWatch


def test_the_debounce_waits_for_quiet_but_not_for_ever() -> None:
    d = Debounce(quiet_s=0.2, max_wait_s=1.0)
    assert d.wait(5.0) is None  # nothing pending
    d.event(10.0)
    assert d.wait(10.0) == pytest.approx(0.2)
    d.event(10.1)
    assert d.wait(10.15) == pytest.approx(0.15)  # 0.2 after the last
    for t in (10.3, 10.5, 10.7, 10.9):  # a stream with no quiet gap
        d.event(t)
    assert d.wait(10.95) == pytest.approx(0.05)  # 1.0 after the first
    assert d.wait(11.2) == 0
    d.fired()
    assert d.wait(11.2) is None


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (run the tests as root)")
    name = f"tsl-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _ip(netns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", netns, *args], check=True)


def test_link_events_trigger_one_debounced_rescan(netns: str) -> None:
    calls: list[int] = []
    lock = threading.Lock()

    def rescan() -> None:
        with lock:
            calls.append(1)

    watch = LinkWatch(rescan, f"/var/run/netns/{netns}",
                      Debounce(quiet_s=0.3, max_wait_s=2.0)).start()
    try:
        _ip(netns, "link", "add", "tsa0", "type", "veth", "peer", "name", "tsa1")
        wait_for("a rescan after the veth appeared", lambda: len(calls) == 1, timeout=3)
        # a burst: one process, so the changes come well inside the quiet time
        subprocess.run(["ip", "-n", netns, "-batch", "-"], check=True, text=True, input=(
            "link set tsa0 up\nlink set tsa1 up\nlink set tsa0 mtu 1400\n"
            "addr add 198.18.7.1/24 dev tsa0\naddr add 2001:db8:7::1/64 dev tsa0 nodad\n"))
        wait_for("one more rescan for the burst", lambda: len(calls) == 2, timeout=3)
        _ip(netns, "link", "del", "tsa0")
        wait_for("a rescan after the pair went", lambda: len(calls) == 3, timeout=3)
    finally:
        watch.stop()
    assert watch.changes == 3
