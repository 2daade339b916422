"""The listening socket of a server command, bound before anything starts,
so an address that cannot be had is one line naming what to change."""

from __future__ import annotations

import socket

from toposerve.serving.http import bind


class ListenError(Exception):
    """The address cannot be listened on; the message is for a person."""


def listen(host: str, port: int, change: str, reuse_port: bool = False) -> socket.socket:
    """A socket listening on ``host:port``; ``change`` says what to change
    when it cannot be had (the flag or config field); ``reuse_port`` as
    for ``bind``."""
    if not host:  # the socket layer would take it for every address
        raise ListenError(f"cannot listen on an empty address, which means every address; "
                          f"change {change} (e.g. 127.0.0.1, or 0.0.0.0 for every address)")
    try:
        return bind(host, port, reuse_port)
    except OSError as err:  # taken, not an address of this host, a name that does not resolve
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        # the bare reason: create_server adds the address to it
        why = str(err.strerror or err).split(" (while attempting", 1)[0]
        raise ListenError(f"cannot listen on {where}: {why}; change {change}") from None
