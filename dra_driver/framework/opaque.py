"""Parsing one opaque config (``config[].opaque.parameters``) into its
pydantic model, with a one-line error that names the field and the fix:
the framework hands that message to the kubelet as the claim's error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def problems(err: ValidationError) -> str:
    """Every error of a validation, ``field: message (hint)``, joined by ``; ``."""
    out = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        hint = ""
        if e["type"] == "extra_forbidden":
            hint = " (unknown field: remove it or check its spelling)"
        elif e["type"] == "missing":
            hint = " (required: add it)"
        # A check of the whole model names its fields in its message.
        out.append(f"{where}: {e['msg']}{hint}" if where else f"{e['msg']}{hint}")
    return "; ".join(out)


def parse_opaque(parameters: Mapping[str, Any], model: type[M], api_version: str,
                 kind: str) -> M:
    """``parameters`` as ``model``; a ``ValueError`` if apiVersion or kind
    is not the expected one or a field is invalid."""
    if parameters.get("apiVersion") != api_version:
        raise ValueError(f"apiVersion: expected {api_version!r}, "
                         f"got {parameters.get('apiVersion')!r}")
    if parameters.get("kind") != kind:
        raise ValueError(f"kind: expected {kind!r}, got {parameters.get('kind')!r}")
    try:
        return model.model_validate(parameters)
    except ValidationError as err:
        raise ValueError(problems(err)) from None
