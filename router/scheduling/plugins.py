"""The shapes of scheduling plugins. A profile runs filters, then weighted
scorers (each score in [0, 1]), then one picker. Scorers of one run share
work through its ``CycleState``; each is told, after the request is
answered, which endpoint answered it.

A plugin a config file may name declares itself (``Declared``): its type
name, its parameter model and how it is built from those parameters; the
registry is made from the classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self, TypeVar

from pydantic import BaseModel, ConfigDict

from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.cycle import CycleState
from toposerve.router.state import RouterState

P = TypeVar("P", covariant=True)


class Filter(Protocol):
    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]: ...


class Scorer(Protocol):
    """Scores candidates in [0, 1]. An endpoint left out of the answer
    scores 0: a scorer that names few (the prefix's holders, the session's
    endpoint) costs the totals nothing for the others. A scorer's answer is
    not changed by its readers."""

    name: ClassVar[str]

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]: ...

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        """Told the endpoint that answered, after any failover (e.g. to
        remember where a prefix went)."""


class Picker(Protocol):
    def pick(self, scores: dict[Endpoint, float]) -> list[Endpoint]:
        """Endpoints best first: the first is used, the rest are retry fallbacks."""


class Params(BaseModel):
    """A plugin's ``params`` in a profile: unknown keys are refused; a key
    is its alias (as config files write it) or its name."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class NoParams(Params):
    """The params of a plugin that takes none (and refuses any)."""


@dataclass(frozen=True)
class Deps:
    """What a plugin is built from besides its params."""

    state: RouterState
    kv: KVIndex | None  # the KV-event index; None without a tokenizer


class Declared(Protocol[P]):
    """A plugin class as the registry sees it (the class itself, not an
    instance): the type name config files use, its parameter model, and
    ``build``, which makes the plugin from params of that model (the
    registry validates them first, so ``build`` may type them as its own)."""

    @property
    def name(self) -> str: ...

    @property
    def params_model(self) -> type[Params]: ...

    def build(self, params: Any, deps: Deps) -> P: ...


@dataclass
class FromState:
    """A plugin that takes no params (and refuses any): built from the
    router's state alone."""

    state: RouterState
    params_model: ClassVar[type[NoParams]] = NoParams

    @classmethod
    def build(cls, params: NoParams, deps: Deps) -> Self:
        return cls(deps.state)


class Stateless:
    """A scorer that reads state but records nothing about the choice."""

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        return None
