"""Plugin type names -> plugin classes, so config files name plugins and
the code never hard-wires a policy. Each class declares its type name, its
parameter model and how it is built (``plugins.Declared``); the tables are
made from the lists below, in the order the config reference lists them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from toposerve.router.scheduling.filters import (
    HealthyFilter,
    ModelFilter,
    NotSaturatedFilter,
    RoleFilter,
)
from toposerve.router.scheduling.pickers import MaxScorePicker
from toposerve.router.scheduling.plugins import Declared, Deps, Filter, Params, Picker, Scorer
from toposerve.router.scheduling.scorers.load import (
    CacheRoomScorer,
    ConversationsScorer,
    InflightTokensScorer,
    KVUsageScorer,
    QueueScorer,
)
from toposerve.router.scheduling.scorers.prefill import NearPrefillScorer, PrefillCostScorer
from toposerve.router.scheduling.scorers.prefix import ApproxPrefixScorer, PrecisePrefixScorer
from toposerve.router.scheduling.scorers.session import SessionScorer

T = TypeVar("T")


class PluginError(ValueError):
    pass


def _params(model: type[Params], raw: dict[str, Any], where: str) -> Params:
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise PluginError(f"{where}.params.{loc}: {first['msg']}") from None


@dataclass(frozen=True)
class Registry(Generic[T]):
    """The plugins of one kind by type name."""

    kind: str  # "filter", "scorer" or "picker", as errors name it
    types: dict[str, Declared[T]]

    @classmethod
    def of(cls, kind: str, plugins: Sequence[Declared[T]]) -> Registry[T]:
        types = {p.name: p for p in plugins}
        if len(types) != len(plugins):
            raise ValueError(f"two {kind}s declare one type name: {[p.name for p in plugins]}")
        return cls(kind, types)

    def build(self, name: str, raw: dict[str, Any], where: str, deps: Deps) -> T:
        """The plugin of type ``name`` with params ``raw``, validated by its
        model; ``where`` names its config section in errors."""
        plugin = self.types.get(name)
        if plugin is None:
            raise PluginError(f"{where}.type: unknown {self.kind} {name!r}; choose one of "
                              f"{', '.join(sorted(self.types))}")
        return plugin.build(_params(plugin.params_model, raw, where), deps)


FILTERS: Registry[Filter] = Registry.of(
    "filter", [ModelFilter, HealthyFilter, NotSaturatedFilter, RoleFilter])
SCORERS: Registry[Scorer] = Registry.of(
    "scorer", [ApproxPrefixScorer, PrecisePrefixScorer, QueueScorer, KVUsageScorer,
               InflightTokensScorer, SessionScorer, CacheRoomScorer, NearPrefillScorer,
               PrefillCostScorer, ConversationsScorer])
PICKERS: Registry[Picker] = Registry.of("picker", [MaxScorePicker])
