"""The names the kubelet and the apiserver hand the driver, checked against
the Kubernetes formats: what real clusters produce passes, nothing else."""

from __future__ import annotations

import pytest

from toposerve.dra_driver.kubeletplugin import validation
from toposerve.dra_driver.kubeletplugin.validation import InvalidName

pytestmark = pytest.mark.unit

UID = "0b7c5a56-0d0e-4f43-9a57-4f1d0a6f2a01"  # version 4, as the apiserver makes them now
UID_V1 = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"  # version 1, as older apiservers made them


@pytest.mark.parametrize("value", [UID, UID_V1])
def test_apiserver_uids_pass(value: str) -> None:
    assert validation.uid(value) == value


@pytest.mark.parametrize("value", [
    "../../etc/cdi/evil", "x/../../escaped", UID + "/..", "a" * 300, UID[:-1] + "\x00",
    UID.upper(), UID.replace("-", ""), UID + "\n", "", "uid-1", " " + UID[1:],
])
def test_anything_else_is_not_a_uid(value: str) -> None:
    with pytest.raises(InvalidName) as err:
        validation.uid(value)
    message = str(err.value)
    assert message.startswith("claim UID ") and "is not a Kubernetes UID" in message
    assert "\n" not in message and "\x00" not in message and len(message) < 300


@pytest.mark.parametrize("value, ok", [
    ("gpu-0", True), ("a", True), ("0", True), ("a" * 63, True),
    ("a" * 64, False), ("-a", False), ("a-", False), ("Gpu-0", False), ("gpu_0", False),
    ("gpu.0", False), ("../gpu", False), ("", False), ("gpu-0\n", False), ("gpu\x00", False),
])
def test_dns_labels(value: str, ok: bool) -> None:
    if ok:
        assert validation.label(value, "device") == value
    else:
        with pytest.raises(InvalidName, match=r"^device .* is not a DNS label"):
            validation.label(value, "device")


@pytest.mark.parametrize("value, ok", [
    ("claim", True), ("my-claim.v1", True), ("a." * 126 + "a", True),
    ("a" * 100 + "." + "b" * 100, True),  # apimachinery checks the whole length only
    ("a" * 254, False), ("a..b", False), (".a", False), ("a.", False), ("Claim", False),
    ("a/b", False), ("", False),
])
def test_dns_subdomains(value: str, ok: bool) -> None:
    if ok:
        assert validation.subdomain(value, "claim name") == value
    else:
        with pytest.raises(InvalidName, match=r"^claim name .* is not a DNS subdomain"):
            validation.subdomain(value, "claim name")


@pytest.mark.parametrize("value, ok", [
    ("gpu", True), ("gpus/large", True),
    ("gpus/large/x", False), ("gpus/", False), ("/large", False), ("Gpus", False),
    ("gpus/../x", False),
])
def test_request_names(value: str, ok: bool) -> None:
    if ok:
        assert validation.request(value) == value
    else:
        with pytest.raises(InvalidName, match=r"^request .* is not <request> or"):
            validation.request(value)


@pytest.mark.parametrize("namespace, name, uid, field", [
    ("Default", "c", UID, "claim namespace"),
    ("default", "c/../x", UID, "claim name"),
    ("default", "c", "../x", "claim UID"),
])
def test_a_claim_names_its_bad_field(namespace: str, name: str, uid: str, field: str) -> None:
    validation.claim("default", "c", UID)
    with pytest.raises(InvalidName, match=f"^{field} "):
        validation.claim(namespace, name, uid)
