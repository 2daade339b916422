"""A scheduling profile: filters, weighted scorers, one picker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.config import ProfileConfig
from router.endpoints import Endpoint
from router.prefix.kv_index import KVIndex
from router.scheduling import registry
from router.scheduling.context import RequestContext
from router.scheduling.plugins import Filter, Picker, Scorer
from router.scheduling.scoring import decisive, weighted_total
from router.state import RouterState


@dataclass
class Decision:
    ranked: list[Endpoint]  # best first; the rest are fallbacks for retries
    reason: str
    scores: dict[str, dict[Endpoint, float]]


class Scheduler:
    def __init__(self, state: RouterState, cfg: ProfileConfig, kv: KVIndex | None,
                 where: str = "profile", first: Sequence[Filter] = ()) -> None:
        """``where`` names the config section in errors; ``first`` are
        filters that run before the configured ones."""
        self.state = state
        self.filters: list[Filter] = [*first] + [
            registry.lookup(registry.FILTERS, "filter", f.type, f"{where}.filters[{i}]")(
                state, f.params, f"{where}.filters[{i}]")
            for i, f in enumerate(cfg.filters)]
        self.scorers: list[tuple[Scorer, float]] = [
            (registry.lookup(registry.SCORERS, "scorer", s.type, f"{where}.scorers[{i}]")(
                state, s.params, f"{where}.scorers[{i}]", kv), s.weight)
            for i, s in enumerate(cfg.scorers)]
        self.picker: Picker = registry.lookup(registry.PICKERS, "picker", cfg.picker.type,
                                              f"{where}.picker")(cfg.picker.params,
                                                                 f"{where}.picker")
        self.weights = {s.name: w for s, w in self.scorers}

    def candidates(self, ctx: RequestContext) -> list[Endpoint]:
        eps = self.state.pool.routable()
        for f in self.filters:
            eps = f.filter(ctx, eps)
        return eps

    def schedule(self, ctx: RequestContext) -> Decision:
        eps = self.candidates(ctx)
        if not eps:
            return Decision([], "no-endpoint", {})
        if len(eps) == 1:
            per: dict[str, dict[Endpoint, float]] = {}
        else:
            per = {s.name: s.score(ctx, eps) for s, _ in self.scorers}
        total = weighted_total(per, self.weights) if per else {eps[0]: 0.0}
        ranked = self.picker.pick(total)
        reason = decisive(per, self.weights, ranked[0], ranked[1] if len(ranked) > 1 else None)
        for s, _ in self.scorers:
            s.picked(ctx, ranked[0])
        return Decision(ranked, reason, per)
