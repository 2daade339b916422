"""Pure scoring maths, tested without sockets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

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


def totals(keys: list[K], per_scorer: Mapping[str, Mapping[K, float]],
           weights: Mapping[str, float]) -> dict[K, float]:
    """``weighted_total`` over ``keys`` (those a scorer leaves out: 0), in
    their order: summed over lists, not dicts (a scorer's dict is read in
    its own order when that is the keys', as the built-in scorers' are),
    the additions in the same order, so the same floats."""
    acc = [0.0] * len(keys)
    for name, scores in per_scorer.items():
        w = weights[name]
        vals = scores.values() if list(scores) == keys else [scores.get(k, 0.0) for k in keys]
        acc = [a + w * s for a, s in zip(acc, vals, strict=True)]
    return dict(zip(keys, acc, strict=True))


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
