"""NetConfig: the opaque config of the NIC driver, and its one-line errors."""

from __future__ import annotations

from ipaddress import IPv4Interface, IPv6Interface, ip_address, ip_network
from typing import Any

import pytest

from toposerve.dra_driver.kubeletplugin import merge_opaque, parse_opaque
from toposerve.dra_driver.net.config import NetConfig, Route


def _params(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": NetConfig.API_VERSION, "kind": NetConfig.KIND, **fields}


def parse_net_config(parameters: dict[str, Any]) -> NetConfig:
    return parse_opaque(parameters, NetConfig)


def merge(configs: list[NetConfig]) -> NetConfig:
    return merge_opaque(configs, NetConfig)


def test_full_config_parses() -> None:
    c = parse_net_config(_params(
        interfaceName="net1", addresses=["198.18.0.2/24", "fd00::2/64"], mtu=9000,
        routes=[{"destination": "198.19.0.0/16", "gateway": "198.18.0.1"},
                {"destination": "0.0.0.0/0"}]))
    assert c.interface_name == "net1" and c.mtu == 9000
    assert c.addresses == [IPv4Interface("198.18.0.2/24"), IPv6Interface("fd00::2/64")]
    assert c.routes == [Route(destination=ip_network("198.19.0.0/16"),
                              gateway=ip_address("198.18.0.1")),
                        Route(destination=ip_network("0.0.0.0/0"))]
    # The JSON form (as in a hand-off record) is the wire's, camelCase, and
    # reads back to the same config.
    assert c.model_dump(mode="json")["interfaceName"] == "net1"
    assert NetConfig.model_validate(c.model_dump(mode="json")) == c


def test_a_record_written_with_apiversion_and_kind_still_reads() -> None:
    """Hand-off records of drivers before the shared convention embedded
    the config with its apiVersion and kind."""
    old: dict[str, Any] = {"apiVersion": "net.toposerve.io/v1", "kind": "NetConfig",
                           "interfaceName": "net1", "addresses": [], "mtu": None, "routes": []}
    assert NetConfig.model_validate(old) == NetConfig(interface_name="net1")


def test_empty_config_keeps_everything() -> None:
    c = parse_net_config(_params())
    assert c == NetConfig() and c.interface_name is None and not c.addresses and not c.routes


@pytest.mark.parametrize("fields, error", [
    ({"adresses": ["198.18.0.2/24"]},
     "adresses: Extra inputs are not permitted (unknown field: did you mean addresses?)"),
    ({"addresses": ["198.18.0.300/24"]},
     "addresses.0: Value error, '198.18.0.300/24' is not a CIDR (address/prefix, "
     "e.g. 198.18.0.2/24)"),
    ({"addresses": ["198.18.0.2"]},
     "addresses.0: Value error, '198.18.0.2' has no prefix length: write it as a CIDR, "
     "e.g. 198.18.0.2/24"),
    ({"addresses": ["198.18.0.2/24", "198.18.0.2/24"]}, "address 198.18.0.2/24 is listed twice"),
    ({"routes": [{"destination": "198.19.0.1/16"}]},
     "routes.0.destination: Value error, '198.19.0.1/16' is not a network: "
     "198.19.0.1/16 has host bits set"),
    ({"routes": [{"destination": "198.19.0.0/16", "gateway": "fd00::1"}]},
     "routes.0: Value error, gateway fd00::1 is IPv6 but destination 198.19.0.0/16 is IPv4"),
    ({"addresses": ["198.18.0.2/24"],
      "routes": [{"destination": "198.19.0.0/16", "gateway": "198.20.0.1"}]},
     "route to 198.19.0.0/16: gateway 198.20.0.1 is on none of the addresses' networks"),
    ({"interfaceName": "much-too-long-name"},
     "interfaceName: Value error, 'much-too-long-name' is not a Linux interface name"),
    ({"interfaceName": "a/b"}, "interfaceName: Value error, 'a/b' is not a Linux interface name"),
    # re's $ matches before a final newline: the name is matched whole
    ({"interfaceName": "eth0\n"},
     "interfaceName: Value error, 'eth0\\n' is not a Linux interface name"),
    ({"mtu": 40}, "mtu 40 is out of range 68-65535"),
    ({"mtu": 1000, "addresses": ["fd00::2/64"]},
     "mtu 1000 is out of range 1280-65535 (IPv6 needs at least 1280)"),
])
def test_bad_config_is_one_clear_line(fields: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_net_config(_params(**fields))
    assert error in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("params, error", [
    ({"kind": "NetConfig"}, "apiVersion: expected 'net.toposerve.io/v1', got None"),
    ({"apiVersion": "toposerve.io/v1", "kind": "NetConfig"}, "apiVersion: expected"),
    ({"apiVersion": "net.toposerve.io/v1", "kind": "GpuConfig"}, "kind: expected 'NetConfig'"),
])
def test_wrong_kind_or_version(params: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_net_config(params)


def test_merge_later_fields_win_and_the_whole_is_checked() -> None:
    cls = parse_net_config(_params(mtu=9000, interfaceName="rdma0"))
    claim = parse_net_config(_params(interfaceName="net1", addresses=["198.18.0.2/24"]))
    assert merge([cls, claim]) == NetConfig(interface_name="net1", mtu=9000,
                                            addresses=[IPv4Interface("198.18.0.2/24")])
    assert merge([]) == NetConfig()
    # Each config is valid alone, together the MTU is too small for IPv6.
    with pytest.raises(ValueError, match="IPv6 needs at least 1280"):
        merge([parse_net_config(_params(mtu=1200)),
               parse_net_config(_params(addresses=["fd00::2/64"]))])
