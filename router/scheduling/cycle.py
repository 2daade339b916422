"""The state of one scheduling cycle: one profile run over one candidate
set for one request (llm-d's CycleState). Work a stage shares with later
plugins of the same run (the prompt's prefix match, say) is stored under a
typed key together with what it was computed for (the block size, the
candidates), so a reader gets it only when it holds for what the reader
asks about. A new cycle starts with every profile run: the decode stage of
a split request, or a run after the pool changed while the request waited
in admission, never reads the prefill stage's numbers."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar, Generic, TypeVar, cast

from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.scheduling.scoring import Wait

T = TypeVar("T")


@dataclass(frozen=True)
class StateKey(Generic[T]):
    """A typed slot of the cycle state; ``T`` is what it holds."""

    name: str


@dataclass(frozen=True)
class PrefixMatch:
    """What an index holds of the prompt on each candidate: the share of
    its leading blocks, the blocks matched (by URL), the prompt's block
    count, and the tokens each endpoint would still have to prefill.
    ``shares``, ``hits``, ``matched`` and ``uncached`` name only the
    candidates that hold some of it (the others: share 0, all ``tokens`` to
    prefill), so they grow with the prefix's holders, not with the fleet."""

    shares: dict[Endpoint, float]
    matched: dict[str, int]
    blocks: int
    uncached: dict[str, int]
    hits: dict[Endpoint, float] = field(default_factory=dict)  # the shares above 0


@dataclass
class CycleState:
    _slots: dict[tuple[StateKey[Any], Hashable], Any] = field(default_factory=dict)
    # the prefix match computed last in this cycle: the proxy weighs the
    # request by its uncached tokens, the metrics read the chosen one's match
    prefix: PrefixMatch | None = None
    # the prompt's keys the approximate index was asked about, per block size:
    # held at the chosen endpoint while the request is on its way there
    approx_keys: dict[int, list[int]] = field(default_factory=dict)
    # the prompt's token-block keys the precise index was asked about: held
    # there too, until the engine's own events can tell
    precise_keys: list[int] | None = None
    _urls: Candidates | None = None
    # the candidates' predicted waits for a first token, when a scorer knows
    # them: the ranking moves those far slower than the fastest to the back
    wait: Wait[Endpoint] | None = None

    def _candidates(self, eps: list[Endpoint]) -> Candidates:
        if (c := self._urls) is not None and c.eps is eps:
            return c
        c = self._urls = Candidates.of(eps)
        return c

    def urls(self, eps: list[Endpoint]) -> tuple[str, ...]:
        """``candidates_key(eps)``, made once for the candidate list the
        scorers of this run share (and reused by the next cycles while the
        filters give the same list)."""
        return self._candidates(eps).urls

    def by_url(self, eps: list[Endpoint]) -> dict[str, Endpoint]:
        """The candidates by URL, made as ``urls`` is. Not to be changed."""
        c = self._candidates(eps)
        if c.by_url is None:
            c.by_url = dict(zip(c.urls, eps, strict=True))
        return c.by_url

    def get(self, key: StateKey[T], of: Hashable) -> T | None:
        return cast("T | None", self._slots.get((key, of)))

    def put(self, key: StateKey[T], of: Hashable, value: T) -> None:
        self._slots[(key, of)] = value

    def memo(self, key: StateKey[T], of: Hashable, compute: Callable[[], T]) -> T:
        """The value stored for ``of``, computed (and stored) on first use."""
        slot = (key, of)
        if slot in self._slots:
            return cast("T", self._slots[slot])
        value = self._slots[slot] = compute()
        return value


URL = attrgetter("url")


@dataclass(eq=False)
class Candidates:
    """A candidate list's URLs (and, once asked, the list by URL), kept for
    the last list seen: the pool and the filters give the same list object
    from request to request while nothing changes, and a candidate list is
    never changed once made. The list is held, so its id is not reused."""

    eps: list[Endpoint]
    urls: tuple[str, ...]
    by_url: dict[str, Endpoint] | None = None
    last: ClassVar[Candidates | None] = None

    @classmethod
    def of(cls, eps: list[Endpoint]) -> Candidates:
        if (c := cls.last) is not None and c.eps is eps:
            return c
        c = cls.last = cls(eps, candidates_key(eps))
        return c


def candidates_key(eps: list[Endpoint]) -> tuple[str, ...]:
    """What a per-candidate result was computed for: the candidates' URLs,
    in order."""
    return tuple(map(URL, eps))
