"""Loading of toposerve YAML files (``apiVersion: toposerve.io/v1`` + ``kind``)
into pydantic models, with errors that name the field and say what to fix."""

from __future__ import annotations

from collections.abc import Callable
from difflib import get_close_matches
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

API_VERSION = "toposerve.io/v1"

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file is unreadable or invalid; the message is for a person."""


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models a field holds (itself, a list's or a mapping's items, an
    optional's value)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models(arg)]


def _known_near(model: type[BaseModel], loc: tuple[int | str, ...]) -> str | None:
    """The field (as written in files) closest to the unknown one at ``loc``."""
    models = [model]
    for part in loc[:-1]:
        fields = [f for m in models for n, f in m.model_fields.items()
                  if part in (n, f.alias)]
        if fields:  # else a list index, a mapping's key or a union's tag
            models = [m for f in fields for m in _models(f.annotation)]
    known = [f.alias or n for m in models for n, f in m.model_fields.items()]
    close = get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    return close[0] if close else None


def hint(error: ErrorDetails, model: type[BaseModel] | None = None) -> str:
    """What to do about one error, `` (fix)``, or nothing. With ``model``
    (the one validated), an unknown field close to a known one is named as
    a likely misspelling."""
    if error["type"] == "extra_forbidden":
        near = _known_near(model, error["loc"]) if model else None
        if near:
            return f" (unknown field: did you mean {near}?)"
        return " (unknown field: remove it or check its spelling)"
    if error["type"] == "missing":
        return " (required: add it)"
    return ""


def explain(err: ValidationError, source: str, model: type[BaseModel] | None = None,
            name: Callable[[tuple[int | str, ...]], str] = _where) -> str:
    """One line for one error (``source: field: what (fix)``); for several, a
    heading line and one line per field. ``model``: as for ``hint``;
    ``name`` says what to call a field (a command line names its flag)."""
    lines = [f"{name(e['loc'])}: {e['msg']}{hint(e, model)}" for e in err.errors()]
    if len(lines) == 1:
        return f"{source}: {lines[0]}"
    return "\n".join([f"{source}: invalid configuration", *(f"  {line}" for line in lines)])


def parse_document(doc: Any, model: type[M], kind: str, source: str) -> M:
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a YAML mapping with apiVersion and kind")
    if "apiVersion" not in doc or "kind" not in doc:
        # a file written for another tool (a plain Helm values file, say)
        raise ConfigError(f"{source}: no {'apiVersion' if 'apiVersion' not in doc else 'kind'}"
                          f": start the file with apiVersion: {API_VERSION} and kind: {kind}")
    if doc.get("apiVersion") != API_VERSION:
        raise ConfigError(
            f"{source}: apiVersion: expected {API_VERSION!r}, got {doc.get('apiVersion')!r}"
        )
    if doc.get("kind") != kind:
        raise ConfigError(f"{source}: kind: expected {kind!r}, got {doc.get('kind')!r}")
    try:
        return model.model_validate(doc)
    except ValidationError as err:
        raise ConfigError(explain(err, source, model)) from None


def read_document(path: str | Path) -> Any:
    """The YAML document in ``path``; ``ConfigError`` when it cannot be read."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{p}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{p}: not UTF-8 text (byte {err.start}): give a YAML file") from None
    try:
        return yaml.load(text, Loader=_UniqueKeys)
    except yaml.YAMLError as err:
        raise ConfigError(f"{p}: not valid YAML: {yaml_problem(err)}") from None


class _UniqueKeys(yaml.SafeLoader):
    """SafeLoader refusing a key given twice in one mapping: PyYAML keeps the
    last silently, so an edit further down the file would undo another."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice: keep one", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def yaml_problem(err: yaml.YAMLError) -> str:
    """What is wrong and where, on one line (PyYAML's own text spans
    several and names the stream, not the file)."""
    if not isinstance(err, yaml.MarkedYAMLError):
        return str(err).replace("\n", " ")
    mark = err.problem_mark or err.context_mark
    what = err.problem or err.context or "invalid YAML"
    return f"{what} (line {mark.line + 1}, column {mark.column + 1})" if mark else what


def load_file(path: str | Path, model: type[M], kind: str) -> M:
    return parse_document(read_document(path), model, kind, str(Path(path)))
