"""Kubernetes resource quantities (the subset toposerve writes: plain
integers and binary/decimal suffixes)."""

from __future__ import annotations

import re

_SUFFIX = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}
_RE = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")


def parse_quantity(text: str) -> int:
    m = _RE.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a whole-number quantity such as 80Gi or 400000")
    return int(m.group(1)) * _SUFFIX[m.group(2) or ""]


def format_bytes(n: int) -> str:
    """The shortest exact binary form: 85899345920 -> '80Gi'."""
    for suffix in ("Pi", "Ti", "Gi", "Mi", "Ki"):
        if n and n % _SUFFIX[suffix] == 0:
            return f"{n // _SUFFIX[suffix]}{suffix}"
    return str(n)
