"""A free TCP port for a process we start on the machine (the scale
runner's extender and simulator, the tests', demos' and benchmarks')."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the OS's pick; another process may take
    it before ours binds, which loopback tests accept)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
