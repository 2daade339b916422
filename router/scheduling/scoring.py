"""Pure scoring maths, tested without sockets."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

K = TypeVar("K")


def lower_is_better(values: Mapping[K, float]) -> dict[K, float]:
    """Min-max normalise so the smallest value scores 1 and the largest 0;
    all equal scores 1."""
    if not values:
        return {}
    lo, hi = min(values.values()), max(values.values())
    if hi == lo:
        return dict.fromkeys(values, 1.0)
    return {k: (hi - v) / (hi - lo) for k, v in values.items()}


def weighted_total(per_scorer: Mapping[str, Mapping[K, float]],
                   weights: Mapping[str, float]) -> dict[K, float]:
    total: dict[K, float] = {}
    for name, scores in per_scorer.items():
        w = weights[name]
        for k, s in scores.items():
            total[k] = total.get(k, 0.0) + w * s
    return total


@functools.cache
def _weighted_sum(n: int) -> Callable[..., list[float]]:
    """``[w0 * s0 + w1 * s1 + ... for each endpoint]`` for ``n`` scorers,
    in one comprehension: one pass over the endpoints, not one a scorer,
    the additions in scorer order (so the same floats as adding scorer by
    scorer from 0.0, but for the sign of an all-zero total, which no
    ranking sees: the picker subtracts it from a random draw). Made once per
    scorer count, as dataclasses makes its methods."""
    ws = [f"w{i}" for i in range(n)]
    ss = [f"s{i}" for i in range(n)]
    vs = [f"v{i}" for i in range(n)]
    terms = " + ".join(f"{w} * {x}" for w, x in zip(ws, ss, strict=True))
    src = (f"def weighted_sum({', '.join(ws + vs)}):\n"
           f"    return [{terms} for {', '.join(ss)}, in zip({', '.join(vs)}, strict=True)]")
    scope: dict[str, Any] = {}
    exec(src, scope)
    return cast(Callable[..., list[float]], scope["weighted_sum"])


def totals(keys: list[K], per_scorer: Mapping[str, Mapping[K, float]],
           weights: Mapping[str, float]) -> dict[K, float]:
    """``weighted_total`` over ``keys`` (those a scorer leaves out: 0), in
    their order, the same floats. A scorer that scores every key is read as
    a list (its dict in its own order when that is the keys', as the
    built-in scorers' are) and summed with the others in one weighted sum
    an endpoint. A scorer that leaves keys out (a sparse one: the prefix
    holders, the session's endpoint) is not: a left-out key adds ``w * 0.0``
    (+0.0, which changes no sum of scores in [0, 1]), so only the keys it
    names are summed again, over every scorer in order. The work an
    endpoint grows with the dense scorers, not with all of them."""
    if not per_scorer:
        return dict.fromkeys(keys, 0.0)
    n = len(keys)
    ws: list[float] = []
    vals: list[list[float]] = []
    named: dict[K, None] = {}  # the keys a sparse scorer names
    for name, scores in per_scorer.items():
        if len(scores) < n and math.isfinite(weights[name]):  # inf * 0.0 is nan
            named.update(dict.fromkeys(scores))
            continue
        ws.append(weights[name])
        vals.append(list(scores.values()) if list(scores) == keys
                    else [scores.get(k, 0.0) for k in keys])
    acc = _weighted_sum(len(vals))(*ws, *vals) if vals else [0.0] * n
    out = dict(zip(keys, acc, strict=True))
    for k in named:
        if k in out:
            t = 0.0
            for name, scores in per_scorer.items():
                t = t + weights[name] * scores.get(k, 0.0)
            out[k] = t
    return out


def decisive(per_scorer: Mapping[str, Mapping[K, float]], weights: Mapping[str, float],
             chosen: K, runner_up: K | None) -> str:
    """The scorer that most separated the chosen endpoint from the runner-up."""
    if runner_up is None:
        return "only-candidate"
    best, gap = "tie", 0.0
    for name, scores in per_scorer.items():
        g = weights[name] * (scores.get(chosen, 0.0) - scores.get(runner_up, 0.0))
        if g > gap:
            best, gap = name, g
    return best


@dataclass(frozen=True)
class Wait(Generic[K]):
    """Predicted seconds before each candidate's first token for this
    request, the candidates that are slow servers, and how much slower than
    the fastest such a candidate may be before no affinity keeps the
    request there: more than ``max_slowdown`` times the fastest's wait and
    more than ``min_extra_s`` longer."""

    seconds: Mapping[K, float]
    slow: AbstractSet[K]
    max_slowdown: float
    min_extra_s: float

    def demote(self, ranked: list[K]) -> list[K]:
        """``ranked`` with the slow candidates too slow for this request moved
        after the others, each group in its order (so retries, too, try the
        others first). The usual case, a first choice that is not too slow,
        looks at one candidate."""
        secs, slow = self.seconds, self.slow
        best = min(secs.values())
        limit = max(best * self.max_slowdown, best + self.min_extra_s)

        def late(k: K) -> bool:
            return k in slow and secs[k] > limit

        if not ranked or not late(ranked[0]):
            return ranked
        return [k for k in ranked if not late(k)] + [k for k in ranked if late(k)]
