"""Pickers: order scored endpoints, best first."""

from __future__ import annotations

import random
from typing import ClassVar

from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.scheduling.plugins import Deps, Params

TIE = 1e-9
_UNITS = 2 / TIE  # half-TIE units a unit of score


class PickerParams(Params):
    seed: int | None = None


class MaxScorePicker:
    """Highest total first; ties broken at random so equal endpoints share load."""

    name: ClassVar[str] = "max-score"
    params_model: ClassVar[type[PickerParams]] = PickerParams

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    @classmethod
    def build(cls, params: PickerParams, deps: Deps) -> MaxScorePicker:
        return cls(params.seed)

    def pick(self, scores: dict[Endpoint, float]) -> list[Endpoint]:
        # one number a key: the score in units of half a TIE, negated (best
        # first), plus a random fraction of a unit, which orders the equal
        # ones (and those within float noise of each other) at random and
        # never reorders scores a TIE apart. Sorted by the key's index, so
        # the sort compares floats, not tuples, and no Python runs a key.
        r = self._rng.random
        keys = [r() - s * _UNITS for s in scores.values()]
        eps = list(scores)
        return list(map(eps.__getitem__, sorted(range(len(keys)), key=keys.__getitem__)))
