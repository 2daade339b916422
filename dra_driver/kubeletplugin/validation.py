"""What the kubelet and the apiserver hand the driver, checked against the
Kubernetes formats before any of it names a file, a path or a CDI device:
claim UIDs, namespaces and names, device and request names. Checked here
and nowhere else, so that every path built from them stays under its root.
"""

from __future__ import annotations

import re

# What the apiserver gives every object (FillObjectMetaSystemFields:
# google/uuid's New().String(); older clusters' pborman v1 UUIDs print
# alike): 36 characters, lowercase hex 8-4-4-4-12. It never keeps a UID a
# client sends on create, so a real claim has no other; the version digit
# is left unchecked (both versions are in clusters today).
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# DNS-1123 label: namespaces, and device and request names (the
# ResourceSlice and ResourceClaim APIs' own rule); at most 63.
_LABEL_PART = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL = re.compile(_LABEL_PART)
LABEL_MAX = 63
# DNS-1123 subdomain: object names such as a claim's; at most 253.
_SUBDOMAIN = re.compile(rf"{_LABEL_PART}(\.{_LABEL_PART})*")
SUBDOMAIN_MAX = 253


class InvalidName(ValueError):
    """A field without its Kubernetes format; the message names the field."""


def _shown(value: str) -> str:
    # repr: a newline or NUL shows as an escape, the message stays one line
    return repr(value) if len(value) <= 80 else f"{value[:80]!r}... ({len(value)} characters)"


def uid(value: str, field: str = "claim UID") -> str:
    if not _UID.fullmatch(value):
        raise InvalidName(f"{field} {_shown(value)} is not a Kubernetes UID (36 characters, "
                          "lowercase hex 8-4-4-4-12, as the apiserver assigns)")
    return value


_LABEL_RULE = (f"a DNS label (at most {LABEL_MAX} characters: lowercase letters, digits and "
               "'-', a letter or digit at each end)")


def _is_label(value: str) -> bool:
    return len(value) <= LABEL_MAX and _LABEL.fullmatch(value) is not None


def label(value: str, field: str) -> str:
    if not _is_label(value):
        raise InvalidName(f"{field} {_shown(value)} is not {_LABEL_RULE}")
    return value


def subdomain(value: str, field: str) -> str:
    # as apimachinery's IsDNS1123Subdomain: the whole length and the pattern
    if len(value) > SUBDOMAIN_MAX or not _SUBDOMAIN.fullmatch(value):
        raise InvalidName(f"{field} {_shown(value)} is not a DNS subdomain (at most "
                          f"{SUBDOMAIN_MAX} characters: DNS labels joined by '.')")
    return value


def request(value: str, field: str = "request") -> str:
    """``<request>`` or ``<request>/<subrequest>`` (an allocation result's
    spelling), each a DNS label."""
    parts = value.split("/")
    if len(parts) > 2 or not all(_is_label(p) for p in parts):
        raise InvalidName(f"{field} {_shown(value)} is not <request> or "
                          f"<request>/<subrequest>, each {_LABEL_RULE}")
    return value


def claim(namespace: str, name: str, claim_uid: str) -> None:
    """A claim's identity as the kubelet names it; raises ``InvalidName``."""
    label(namespace, "claim namespace")
    subdomain(name, "claim name")
    uid(claim_uid)
