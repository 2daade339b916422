"""Opaque configs (``config[].opaque.parameters``), one convention for every
driver on the framework: a pydantic model derived from ``OpaqueConfig``
(camelCase fields on the wire, as Kubernetes APIs have them, snake_case in
Python; apiVersion ``<driver>/v1``), parsed with a one-line error that names
the field and the fix (the framework hands it to the kubelet as the claim's
error), and the configs of a device merged claim over class."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from toposerve.topology.config_file import hint

ENVELOPE = ("apiVersion", "kind")


class OpaqueConfig(BaseModel):
    """A driver's opaque config. A subclass names its ``API_VERSION``
    (``<driver>/v1``) and ``KIND``, and may keep accepting older apiVersions
    (``DEPRECATED_API_VERSIONS``) so existing claims go on working."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel,
                              validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    API_VERSION: ClassVar[str]
    KIND: ClassVar[str]
    DEPRECATED_API_VERSIONS: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _without_envelope(cls, data: Any) -> Any:
        # apiVersion and kind say which model it is (parse_opaque checks
        # them), not how the device is set up; records written when they
        # were fields of the model still carry them.
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if k not in ENVELOPE}
        return data


C = TypeVar("C", bound=OpaqueConfig)


def problems(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """Every error of a validation, ``field: message (hint)``, joined by ``; ``
    (with ``model``, the one validated, a misspelt field's likely name)."""
    out = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        line = f"{e['msg']}{hint(e, model)}"
        # A check of the whole model names its fields in its message.
        out.append(f"{where}: {line}" if where else line)
    return "; ".join(out)


def parse_opaque(parameters: Mapping[str, Any], model: type[C]) -> C:
    """``parameters`` as ``model``; a ``ValueError`` if apiVersion or kind
    is not the model's or a field is invalid."""
    api_version = parameters.get("apiVersion")
    if api_version not in (model.API_VERSION, *model.DEPRECATED_API_VERSIONS):
        raise ValueError(f"apiVersion: expected {model.API_VERSION!r}, got {api_version!r}")
    if parameters.get("kind") != model.KIND:
        raise ValueError(f"kind: expected {model.KIND!r}, got {parameters.get('kind')!r}")
    try:
        return model.model_validate(parameters)
    except ValidationError as err:
        raise ValueError(problems(err, model)) from None


def merge_opaque(configs: Iterable[object], model: type[C]) -> C:
    """The configs of type ``model`` among ``configs`` (lowest precedence
    first: the class's, then the claim's, as ``AllocatedDevice.configs``
    has them) as one: a field a later config sets replaces the earlier
    value, except a mapping (``env``), which is merged key by key; lists
    are replaced. The whole is validated again (a class's routes with a
    claim's addresses); a ``ValueError`` says what is wrong."""
    fields: dict[str, Any] = {}
    for c in configs:
        if not isinstance(c, model):
            continue
        for name in c.model_fields_set:
            value, before = getattr(c, name), fields.get(name)
            if isinstance(value, Mapping) and isinstance(before, Mapping):
                value = {**before, **value}
            fields[name] = value
    try:
        return model.model_validate(fields)
    except ValidationError as err:
        raise ValueError("the class's and the claim's configs together are invalid: "
                         f"{problems(err, model)}") from None
