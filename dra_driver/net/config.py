"""``NetConfig``: the opaque parameters a DeviceClass or a claim gives the
NIC driver (``config[].opaque{driver: net.toposerve.io, parameters}``), i.e.
how the NIC looks once it is in the pod's network namespace.

    apiVersion: net.toposerve.io/v1
    kind: NetConfig
    interfaceName: net1              # name inside the pod (default: the host's name)
    addresses: [198.18.0.2/24]       # CIDRs; an explicit prefix length is required
    mtu: 9000
    routes:
    - {destination: 198.19.0.0/16, gateway: 198.18.0.1}

Configs of the class come first and the claim's after; a field a later
config sets replaces the earlier value (lists are replaced, not merged;
``merge_opaque``).
"""

from __future__ import annotations

import re
from ipaddress import (
    IPv4Address,
    IPv4Interface,
    IPv4Network,
    IPv6Address,
    IPv6Interface,
    IPv6Network,
    ip_address,
    ip_interface,
    ip_network,
)
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from toposerve.dra_driver.kubeletplugin.opaque import OpaqueConfig

# Linux interface names: at most 15 bytes (IFNAMSIZ - 1), no '/', ':' or
# whitespace, and not "." or "..".
IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
MIN_MTU, MIN_MTU_IPV6, MAX_MTU = 68, 1280, 65535



def _no_zone(v: str) -> None:
    # ipaddress takes an IPv6 zone ("fe80::1%eth0", any text after the %);
    # netlink, networkData and CNI results have no such thing, so the
    # claim's text would travel on verbatim: refuse it.
    if "%" in v:
        raise ValueError(f"{v!r} has an IPv6 zone (%...): leave it out, the interface is "
                         "the zone")


def _cidr(v: Any) -> Any:
    # A bare address would silently become a /32 (or /128): say so instead.
    if not isinstance(v, str):
        return v
    _no_zone(v)
    if "/" not in v:
        raise ValueError(f"{v!r} has no prefix length: write it as a CIDR, e.g. {v}/24")
    try:
        return ip_interface(v)
    except ValueError:
        raise ValueError(f"{v!r} is not a CIDR (address/prefix, e.g. 198.18.0.2/24)") from None


def _network(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    _no_zone(v)
    try:
        return ip_network(v)
    except ValueError as err:
        raise ValueError(f"{v!r} is not a network: {err}") from None


def _address(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    _no_zone(v)
    try:
        return ip_address(v)
    except ValueError:
        raise ValueError(f"{v!r} is not an IP address") from None


# The parsers above turn a string into the right type first, so a bad value
# gets one readable error instead of one for each member of the union.
Address = Annotated[IPv4Interface | IPv6Interface, BeforeValidator(_cidr)]
Network = Annotated[IPv4Network | IPv6Network, BeforeValidator(_network)]
Gateway = Annotated[IPv4Address | IPv6Address, BeforeValidator(_address)]


def check_ifname(name: str) -> str:
    if not IFNAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{name!r} is not a Linux interface name (1-15 of A-Z a-z 0-9 _ . -)")
    return name


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    destination: Network = Field(
        description="the network the route leads to, e.g. 198.19.0.0/16 (0.0.0.0/0 for a "
                    "default route); host bits must be zero")
    gateway: Gateway | None = Field(
        default=None, description="next hop; without one the route is on the link")

    @model_validator(mode="after")
    def _family(self) -> Self:
        if self.gateway is not None and self.gateway.version != self.destination.version:
            raise ValueError(f"gateway {self.gateway} is IPv{self.gateway.version} but "
                             f"destination {self.destination} is IPv{self.destination.version}")
        return self


class NetConfig(OpaqueConfig):
    API_VERSION: ClassVar[str] = "net.toposerve.io/v1"
    KIND: ClassVar[str] = "NetConfig"

    interface_name: str | None = Field(
        default=None, description="the interface's name inside the pod (default: keep the "
                                  "host's name)")
    addresses: list[Address] = Field(
        default_factory=list,
        description="addresses to set in the pod, as CIDRs (198.18.0.2/24, fd00::2/64)")
    mtu: int | None = Field(default=None, description="MTU to set in the pod")
    routes: list[Route] = Field(default_factory=list,
                                description="routes through this interface, in the pod")

    @field_validator("interface_name")
    @classmethod
    def _ifname(cls, v: str | None) -> str | None:
        return None if v is None else check_ifname(v)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.mtu is not None:
            low = MIN_MTU_IPV6 if any(a.version == 6 for a in self.addresses) else MIN_MTU
            if not low <= self.mtu <= MAX_MTU:
                raise ValueError(f"mtu {self.mtu} is out of range {low}-{MAX_MTU}"
                                 + (" (IPv6 needs at least 1280)" if low == MIN_MTU_IPV6
                                    else ""))
        seen: set[Address] = set()
        for a in self.addresses:
            if a in seen:
                raise ValueError(f"address {a} is listed twice")
            seen.add(a)
        for r in self.routes:
            if r.gateway is not None and not any(r.gateway in a.network
                                                 for a in self.addresses):
                raise ValueError(f"route to {r.destination}: gateway {r.gateway} is on none "
                                 "of the addresses' networks (add an address on its subnet)")
        return self

