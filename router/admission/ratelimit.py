"""Token buckets for tenants' request and token rates, on a clock passed in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Bucket:
    """``rate`` a second, holding at most ``burst``; starts full."""

    rate: float
    burst: float
    level: float = 0.0  # may go below 0: a large request's debt
    at: float | None = None  # None: never used, full

    def take(self, amount: float, now: float) -> bool:
        """Takes ``amount`` if the bucket holds it (an amount above the burst
        is let through when the bucket is full, so a large request is slowed,
        not refused for ever)."""
        if self.at is None:
            self.level, self.at = self.burst, now
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level >= min(amount, self.burst):
            self.level -= amount
            return True
        return False

    def settle(self, amount: float, now: float) -> None:
        """Takes ``amount`` more (negative: gives back what was taken in
        excess), whatever the level: the real cost of what went already."""
        if self.at is None:
            self.level, self.at = self.burst, now
        self.level = min(self.burst, self.level + (now - self.at) * self.rate - amount)
        self.at = now


def bucket(rate: float | None) -> Bucket | None:
    """A bucket with one second's worth of burst (at least 1), or none."""
    return None if rate is None else Bucket(rate, max(1.0, rate))
