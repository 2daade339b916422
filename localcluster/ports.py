"""A free TCP port for a process we start on the machine (the scale
runner's extender and simulator, the tests', demos' and benchmarks')."""

from __future__ import annotations

import random
import socket
from collections import deque
from pathlib import Path

# The port is checked here and bound later by another process. A port the OS
# picks for bind(0) is an ephemeral one, which any outgoing connection on the
# machine may take in between: with a benchmark opening thousands of
# connections a second that race was lost (the null backend's EADDRINUSE).
# The kernel never gives ports below its ephemeral range to connect(), so we
# pick there, above the 10xxx ports Kubernetes' own parts listen on and below
# the NodePort range.
LOW, HIGH = 20000, 30000
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
TRIES = 64
_recent: deque[int] = deque(maxlen=1024)  # handed out lately, not yet bound perhaps
_pick = random.Random()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's
    default where it cannot be read)."""
    try:
        lo, hi = map(int, EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return lo, hi


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, below the ephemeral range so that no
    outgoing connection takes it before our process binds it; not one this
    process was given lately. Where the range leaves no room below it, the
    OS's pick (then another process may take it first)."""
    top = min(HIGH, ephemeral_range()[0])
    if top - LOW >= 1000:
        for _ in range(TRIES):
            port = _pick.randrange(LOW, top)
            if port not in _recent and _bindable(host, port):
                _recent.append(port)
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
