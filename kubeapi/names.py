"""Kubernetes' own name formats, for checking a name before the apiserver
(or a component's config loader) refuses it."""

from __future__ import annotations

import re

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# most object names, a DeviceClass's, a pod's spec.schedulerName
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SUBDOMAIN = re.compile(DNS_SUBDOMAIN)


def is_subdomain(name: str) -> bool:
    return len(name) <= 253 and SUBDOMAIN.match(name) is not None
