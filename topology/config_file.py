"""Loading of toposerve YAML files (``apiVersion: toposerve.io/v1`` + ``kind``)
into pydantic models, with errors that name the field and say what to fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

API_VERSION = "toposerve.io/v1"

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file is unreadable or invalid; the message is for a person."""


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def explain(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        hint = ""
        if e["type"] == "extra_forbidden":
            hint = " (unknown field: remove it or check its spelling)"
        elif e["type"] == "missing":
            hint = " (required: add it)"
        lines.append(f"  {_where(e['loc'])}: {e['msg']}{hint}")
    return "\n".join(lines)


def parse_document(doc: Any, model: type[M], kind: str, source: str) -> M:
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a YAML mapping with apiVersion and kind")
    if doc.get("apiVersion") != API_VERSION:
        raise ConfigError(
            f"{source}: apiVersion: expected {API_VERSION!r}, got {doc.get('apiVersion')!r}"
        )
    if doc.get("kind") != kind:
        raise ConfigError(f"{source}: kind: expected {kind!r}, got {doc.get('kind')!r}")
    try:
        return model.model_validate(doc)
    except ValidationError as err:
        raise ConfigError(explain(err, source)) from None


def load_file(path: str | Path, model: type[M], kind: str) -> M:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError(f"{p}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{p}: not UTF-8 text (byte {err.start}): give a YAML file") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{p}: not valid YAML: {err}") from None
    return parse_document(doc, model, kind, str(p))
