"""A scheduling profile: filters, weighted scorers, one picker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from toposerve.router.config import ProfileConfig
from toposerve.router.pool.endpoints import Endpoint, Work
from toposerve.router.prefix.index import Sent
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.request import RequestContext
from toposerve.router.scheduling import registry
from toposerve.router.scheduling.cycle import URL, CycleState
from toposerve.router.scheduling.plugins import Deps, Filter, Picker, Scorer
from toposerve.router.scheduling.scoring import decisive, totals
from toposerve.router.state import RouterState


@dataclass
class Decision:
    """One profile run's answer for one request."""

    ctx: RequestContext
    ranked: list[Endpoint]  # best first; the rest are fallbacks for retries
    reason: str
    scores: dict[str, dict[Endpoint, float]]
    cycle: CycleState = field(default_factory=CycleState)
    scorers: Sequence[Scorer] = ()
    sent: list[Sent] = field(default_factory=list)  # held where it was sent first

    def answered(self, ep: Endpoint) -> None:
        """The request went to ``ep`` (the endpoint that answered, after
        any failover): the scorers that keep state record it there."""
        for held in self.sent:
            held.settle()
        for s in self.scorers:
            s.picked(self.ctx, self.cycle, ep)

    def work(self) -> Work:
        """What the request weighs on each ranked endpoint: its prompt
        tokens, and those the endpoint does not hold (to prefill)."""
        p = self.cycle.prefix
        return Work(self.ctx.token_estimate, p.uncached if p is not None else {}, self.answered)

    def no_prefill(self) -> Work:
        """A decode endpoint's weight: the request's tokens, none to prefill."""
        return Work(self.ctx.token_estimate, dict.fromkeys(map(URL, self.ranked), 0),
                    self.answered)

    def whole(self) -> Work:
        """The request whole, prefilled wherever it goes."""
        return Work(self.ctx.token_estimate, {}, self.answered)


class Scheduler:
    def __init__(self, state: RouterState, cfg: ProfileConfig, kv: KVIndex | None,
                 where: str = "profile", first: Sequence[Filter] = ()) -> None:
        """``where`` names the config section in errors; ``first`` are
        filters that run before the configured ones."""
        self.state = state
        deps = Deps(state, kv)
        self.filters: list[Filter] = [*first] + [
            registry.FILTERS.build(f.type, f.params, f"{where}.filters[{i}]", deps)
            for i, f in enumerate(cfg.filters)]
        self.scorers: list[tuple[Scorer, float]] = [
            (registry.SCORERS.build(s.type, s.params, f"{where}.scorers[{i}]", deps), s.weight)
            for i, s in enumerate(cfg.scorers)]
        self.picker: Picker = registry.PICKERS.build(cfg.picker.type, cfg.picker.params,
                                                     f"{where}.picker", deps)
        # one entry per type (ProfileConfig refuses a second), so names are keys
        self.weights = {s.name: w for s, w in self.scorers}

    def candidates(self, ctx: RequestContext) -> list[Endpoint]:
        eps = self.state.pool.routable()
        if (subset := ctx.subset) is not None:  # before any filter: a revision is chosen in it
            eps = [e for e in eps if e.name in subset]
        for f in self.filters:
            eps = f.filter(ctx, eps)
        return eps

    def schedule(self, ctx: RequestContext) -> Decision:
        """Rank the candidates in a new cycle. Nothing is recorded yet: the
        proxy calls ``Decision.answered`` with the endpoint that answers."""
        cycle = CycleState()
        scorers = [s for s, _ in self.scorers]
        eps = self.candidates(ctx)
        if not eps:
            return Decision(ctx, [], "no-endpoint", {}, cycle, scorers)
        if len(eps) == 1:
            per: dict[str, dict[Endpoint, float]] = {}
        else:
            per = {s.name: s.score(ctx, cycle, eps) for s in scorers}
        ranked = self.picker.pick(totals(eps, per, self.weights))
        reason = decisive(per, self.weights, ranked[0], ranked[1] if len(ranked) > 1 else None)
        if cycle.wait is not None:
            first, ranked = ranked[0], cycle.wait.demote(ranked)
            if ranked[0] is not first:
                reason = "prefill-cost"  # its predicted wait overruled the affinity
        # until it answers, the first-ranked endpoint counts as holding the
        # prompt for requests scheduled meanwhile (toposerve.router.prefix.index)
        sent = [h for keys in cycle.approx_keys.values()
                if (h := self.state.approx.send(ranked[0].url, keys)) is not None]
        if cycle.precise_keys and (h := self.state.precise.send(
                ranked[0].url, cycle.precise_keys)) is not None:
            sent.append(h)
        return Decision(ctx, ranked, reason, per, cycle, scorers, sent)
