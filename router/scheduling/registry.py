"""Plugin type names -> factories, so config files name plugins and the
code never hard-wires a policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.scheduling.filters import (
    HealthyFilter,
    ModelFilter,
    NotSaturatedFilter,
    RoleFilter,
)
from toposerve.router.scheduling.pickers import MaxScorePicker
from toposerve.router.scheduling.plugins import Filter, Picker, Scorer
from toposerve.router.scheduling.scorers.load import (
    CacheRoomScorer,
    ConversationsScorer,
    InflightTokensScorer,
    KVUsageScorer,
    QueueScorer,
)
from toposerve.router.scheduling.scorers.prefill import (
    MAX_SLOWDOWN,
    MIN_EXTRA_S,
    NearPrefillScorer,
    PrefillCostScorer,
)
from toposerve.router.scheduling.scorers.prefix import (
    APPROX_BLOCK_BYTES,
    ApproxPrefixScorer,
    PrecisePrefixScorer,
)
from toposerve.router.scheduling.scorers.session import SessionScorer
from toposerve.router.state import RouterState


class PluginError(ValueError):
    pass


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class NoParams(_Params):
    pass


class PrefixParams(_Params):
    block_bytes: int = Field(default=APPROX_BLOCK_BYTES, alias="blockBytes", ge=16)


class PrefillCostParams(PrefixParams):
    max_slowdown: float = Field(
        default=MAX_SLOWDOWN, alias="maxSlowdown", ge=0,
        description="an endpoint learned 1.5x or more slower than the median, predicted to wait "
                    "this many times the fastest's for a first token (and minExtraSeconds "
                    "longer), goes to the back of the ranking; 0: never")
    min_extra_s: float = Field(default=MIN_EXTRA_S, alias="minExtraSeconds", ge=0)

    @field_validator("max_slowdown")
    @classmethod
    def _slowdown(cls, v: float) -> float:
        if 0 < v < 1:
            raise ValueError("must be 0 (off) or at least 1: the fastest itself waits 1 times "
                             "its own wait")
        return v


class RoleParams(_Params):
    role: str = "decode"
    exact: bool = False


class ConversationParams(_Params):
    window_s: float = Field(default=300.0, alias="windowSeconds", gt=0)
    block_bytes: int = Field(default=APPROX_BLOCK_BYTES, alias="blockBytes", ge=16)


class PickerParams(_Params):
    seed: int | None = None


def _params(model: type[_Params], raw: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise PluginError(f"{where}.params.{loc}: {first['msg']}") from None


FilterFactory = Callable[[RouterState, dict[str, Any], str], Filter]
ScorerFactory = Callable[[RouterState, dict[str, Any], str, KVIndex | None], Scorer]

def _plain(cls: Callable[[RouterState], Any]) -> Callable[..., Any]:
    """A factory for a plugin that takes no params (and refuses any)."""
    def make(s: RouterState, p: dict[str, Any], w: str, *_: Any) -> Any:
        _params(NoParams, p, w)
        return cls(s)
    return make


FILTERS: dict[str, FilterFactory] = {
    "model": _plain(ModelFilter),
    "healthy": _plain(HealthyFilter),
    "not-saturated": _plain(NotSaturatedFilter),
    "role": lambda s, p, w: RoleFilter(s, **_params(RoleParams, p, w).model_dump()),
}


def _approx(s: RouterState, p: dict[str, Any], w: str) -> ApproxPrefixScorer:
    return ApproxPrefixScorer(s, _params(PrefixParams, p, w).block_bytes)


def _conversations(s: RouterState, p: ConversationParams) -> ConversationsScorer:
    return ConversationsScorer(s, p.window_s, p.block_bytes)


SCORERS: dict[str, ScorerFactory] = {
    "prefix-approx": lambda s, p, w, kv: _approx(s, p, w),
    "prefix-precise": lambda s, p, w, kv: PrecisePrefixScorer(s, kv, _approx(s, p, w)),
    "queue": _plain(QueueScorer),
    "kv-usage": _plain(KVUsageScorer),
    "inflight-tokens": _plain(InflightTokensScorer),
    "session": _plain(SessionScorer),
    "cache-room": _plain(CacheRoomScorer),
    "near-prefill": _plain(NearPrefillScorer),
    "prefill-cost": lambda s, p, w, kv: PrefillCostScorer(
        s, **_params(PrefillCostParams, p, w).model_dump()),
    "conversations": lambda s, p, w, kv: _conversations(s, _params(ConversationParams, p, w)),
}

PICKERS: dict[str, Callable[[dict[str, Any], str], Picker]] = {
    "max-score": lambda p, w: MaxScorePicker(_params(PickerParams, p, w).seed),
}


def lookup(table: dict[str, Any], kind: str, name: str, where: str) -> Any:
    if name not in table:
        raise PluginError(f"{where}.type: unknown {kind} {name!r}; choose one of "
                          f"{', '.join(sorted(table))}")
    return table[name]
