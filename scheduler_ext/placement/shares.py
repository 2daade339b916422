"""Shares of accelerators that allow multiple allocations (DRA consumable
capacity: GPU memory shares), counted as the DRA allocator counts them.

A shareable unit holding no share is free like any unit. Once it holds one
it is used for whole-device requests (a claim asking no memory consumes the
policy's default, all of it but under a step, which never fits beside a
share), and it has **room**: its capacity less what its shares consumed.
A pod's shares go into the rooms first and open free units only for what
does not fit, so how many units a share-asking pod takes depends on the
node: none where its shares fit the room left beside other shares.
Pure functions over plain numbers (bytes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MAX_SHARES = 256  # a claim holds at most 32 requests of at most 8 devices: past it, not packed


def room(capacity: int, consumed: Iterable[int]) -> int:
    """What is left of a unit's ``capacity`` beside the shares it holds."""
    return max(0, capacity - sum(consumed))


def fresh_units(asks: Sequence[int], rooms: Sequence[int], unit: int) -> int | None:
    """How many free units of ``unit`` bytes ``asks`` need beyond the
    ``rooms`` of units already shared: largest ask first, each into the
    tightest room it fits, else into a newly opened unit (``unit`` 0: none
    to open). None when an ask fits neither (or there are more than
    ``MAX_SHARES``)."""
    if not asks:
        return 0
    if len(asks) > MAX_SHARES:
        return None
    left = sorted(r for r in rooms if r > 0)
    opened = 0
    for ask in sorted(asks, reverse=True):
        fits = next((i for i, r in enumerate(left) if r >= ask), None)
        if fits is None:
            if ask > unit:
                return None
            opened += 1
            rest = unit - ask
        else:
            rest = left.pop(fits) - ask
        if rest > 0:
            # kept sorted, so the next ask takes the tightest room it fits
            at = next((i for i, r in enumerate(left) if r >= rest), len(left))
            left.insert(at, rest)
    return opened


def round_up(ask: int, least: int, step: int) -> int:
    """What a request of ``ask`` consumes under a policy of ``least`` and
    ``step`` (``validRange``: below ``least`` it takes ``least``, else the
    next multiple of ``step`` above ``least``); ``step`` 0: as asked."""
    if ask <= least:
        return least
    if step <= 0:
        return ask
    return least + -(-(ask - least) // step) * step
