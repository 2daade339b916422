"""A claim's NetConfig is its author's: an IPv6 zone (``fe80::1%eth0``),
which Python's ipaddress takes, is no CIDR or gateway the kernel, the
claim's networkData or a CNI result means; it was passed on verbatim (the
CNI result named ``fe80::1%x;y=z/64``) and CHECK then failed forever."""

from __future__ import annotations

import pytest

from toposerve.dra_driver.kubeletplugin import parse_opaque
from toposerve.dra_driver.net.config import NetConfig

BASE = {"apiVersion": "net.toposerve.io/v1", "kind": "NetConfig"}


@pytest.mark.parametrize("extra, field", [
    ({"addresses": ["fe80::1%eth0/64"]}, "addresses.0"),
    ({"addresses": ["fe80::1%x;y=z/64"]}, "addresses.0"),
    ({"addresses": ["fe80::1/64"], "routes": [{"destination": "::/0",
                                                "gateway": "fe80::2%eth0"}]},
     "routes.0.gateway"),
    ({"routes": [{"destination": "fe80::%eth0/64"}]}, "routes.0.destination"),
])
def test_an_ipv6_zone_is_refused(extra: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_opaque({**BASE, **extra}, NetConfig)
    assert f"{field}: Value error" in str(err.value) and "zone" in str(err.value)


def test_plain_ipv6_still_passes() -> None:
    cfg = parse_opaque({**BASE, "addresses": ["fe80::1/64", "2001:db8::2/64"],
                        "routes": [{"destination": "::/0", "gateway": "fe80::2"}]}, NetConfig)
    assert [str(a) for a in cfg.addresses] == ["fe80::1/64", "2001:db8::2/64"]
