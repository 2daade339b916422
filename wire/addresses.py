"""The addresses a model server is reached at: its HTTP base URL and the
ZMQ endpoints of its KV events, checked where a configuration names them.
The clients take far more than can be dialled (aiohttp fails each request
to ``http://[::1``; ZMQ connects to ``tcp://h:70000`` and retries forever)
and say so only at the first connection, in a log line or a traceback.
``dialable`` is the part every URL check shares."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

__all__ = ["dialable", "zmq_endpoint"]

_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"
_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
# the longest path of a Unix socket (sun_path, less its terminating NUL)
_IPC_PATH_BYTES = 107


def _is_host(host: str) -> bool:
    """An IP address (an IPv6 one was in brackets) or a DNS name."""
    if ":" in host:
        return True  # urlsplit checked what was in brackets
    if re.fullmatch(r"[\d.]+", host):  # 999.1.1.1 is no name
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    return bool(_NAME.fullmatch(host))


def dialable(url: str, port_required: bool = False) -> None:
    """ValueError saying what is wrong unless ``url`` (scheme://HOST[:PORT]...)
    names a host and port that can be dialled."""
    parts = urlsplit(url)  # ValueError for an IPv6 address without its ]
    try:
        port = parts.port
    except ValueError:  # not a number, or over 65535
        port = 0
    host = parts.hostname
    if not host:
        raise ValueError("no host")
    if not _is_host(host):
        raise ValueError(f"{host!r} is not a host name or an IP address")
    if port is None and port_required:
        raise ValueError("no port")
    if port == 0:
        raise ValueError("the port is not a number from 1 to 65535")


def zmq_endpoint(address: str) -> str:
    """``address`` when ZMQ can connect to it as the router subscribes:
    ``tcp://HOST:PORT`` (an IPv6 address in brackets) or ``ipc://PATH``;
    else ValueError saying what is wrong."""
    scheme, sep, rest = address.partition("://")
    if scheme == "ipc" and sep:
        if not rest:
            raise ValueError("no socket path after ipc://")
        if len(rest.encode()) > _IPC_PATH_BYTES:
            raise ValueError(f"the socket path is over {_IPC_PATH_BYTES} bytes")
        return address
    if scheme != "tcp" or not sep:
        raise ValueError("not tcp:// or ipc://")
    if re.search(r"[/;?#]", rest):  # a path; ZMQ's source-address form
        raise ValueError("more than HOST:PORT after tcp://")
    dialable(address, port_required=True)
    return address
