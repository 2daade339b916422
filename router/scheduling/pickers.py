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
        keyed = [(-(round(s / TIE) * TIE), self._rng.random(), e) for e, s in scores.items()]
        keyed.sort(key=lambda t: (t[0], t[1]))
        return [e for _, _, e in keyed]
