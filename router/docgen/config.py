"""The router config reference, generated from the pydantic models so it
cannot drift from them: ``python -m toposerve.router.docgen.config > docs/router-config.md``
(a unit test checks the committed file is current)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from toposerve.router.config import RouterConfig
from toposerve.router.scheduling import registry


def _plugins(plugins: registry.Registry[Any]) -> str:
    """Each type name, with its params' keys where it takes any."""
    out = []
    for name, p in plugins.types.items():
        keys = ", ".join(f.alias or k for k, f in p.params_model.model_fields.items())
        out.append(f"{name} (params: {keys})" if keys else name)
    return ", ".join(out)


def _type(ann: Any) -> str:
    name = getattr(ann, "__name__", None)
    text = str(ann) if name is None or "[" in str(ann) else name
    return text.replace("typing.", "").replace("toposerve.router.config.", "").replace("|", "\\|")


def _default(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    if f.default_factory is not None:
        value = f.get_default(call_default_factory=True)
        return "(see below)" if isinstance(value, BaseModel) else f"`{value!r}`"
    if isinstance(f.default, Enum):
        return f"`{f.default.value!r}`"
    return f"`{f.default!r}`"


def render(model: type[BaseModel] = RouterConfig, title: str = "RouterConfig") -> str:
    lines = [f"# {title} reference", "",
             "Generated from `router/config.py`; `apiVersion: toposerve.io/v1`, "
             "`kind: RouterConfig`.", ""]
    seen: set[type[BaseModel]] = set()

    def section(path: str, m: type[BaseModel]) -> None:
        if m in seen:
            return
        seen.add(m)
        lines.extend([f"## `{path or '(top level)'}`", "", (m.__doc__ or "").strip(), "",
                      "| field | type | default | meaning |", "|---|---|---|---|"])
        nested = []
        for name, f in m.model_fields.items():
            key = f.alias or name
            desc = (f.description or "").replace("|", "\\|")
            lines.append(f"| `{key}` | {_type(f.annotation)} | {_default(f)} | {desc} |")
            for sub in getattr(f.annotation, "__args__", (f.annotation,)):
                inner = getattr(sub, "__args__", (sub,))
                for t in inner:
                    if isinstance(t, type) and issubclass(t, BaseModel):
                        nested.append((f"{path}.{key}" if path else key, t))
        lines.append("")
        for p, t in nested:
            section(p, t)

    section("", model)
    plugins: dict[str, registry.Registry[Any]] = {
        "filters": registry.FILTERS, "scorers": registry.SCORERS, "picker": registry.PICKERS}
    lines += ["## Plugin types", ""] + [f"* `{k}`: {_plugins(v)}" for k, v in plugins.items()]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
