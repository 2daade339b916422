"""Pickers: order scored endpoints, best first."""

from __future__ import annotations

import random

from router.pool.endpoints import Endpoint

TIE = 1e-9


class MaxScorePicker:
    """Highest total first; ties broken at random so equal endpoints share load."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def pick(self, scores: dict[Endpoint, float]) -> list[Endpoint]:
        # one number a key: the score in steps of TIE, negated (best first),
        # plus a random fraction under a step, which orders the equal ones
        # at random and never crosses a step. Sorted by the key's index, so
        # the sort compares floats, not tuples, and no Python runs a key.
        r = self._rng.random
        keys = [-round(s / TIE) + 0.5 * r() for s in scores.values()]
        eps = list(scores)
        return list(map(eps.__getitem__, sorted(range(len(keys)), key=keys.__getitem__)))
