"""Value types the benchmarks' command lines share. argparse calls them on
each value, so a count of 0 clients, a negative duration or a CPU this
process may not use is refused before anything starts, with argparse's
one-line usage error naming the flag (exit 2), never a hang or a
traceback from deep in a run."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def at_least(low: int) -> Callable[[str], int]:
    """A whole number of ``low`` or more."""
    def parse(text: str) -> int:
        n = _whole(text)
        if n < low:
            raise argparse.ArgumentTypeError(f"{n} is under {low}, the least it can be")
        return n
    return parse


count = at_least(1)  # clients, requests, nodes, repeats: at least one
count_or_zero = at_least(0)  # where 0 means none, or off


def positive(text: str) -> float:
    """A finite number above 0 (seconds, a time compression)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return x


def tcp_port(text: str) -> int:
    """A TCP port to listen on: 1-65535."""
    n = _whole(text)
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not a TCP port (1-65535)")
    return n


def cpu(text: str) -> int:
    """A CPU this process may run on (what it may pin its children to)."""
    n = _whole(text)
    allowed = sorted(os.sched_getaffinity(0))
    if n not in allowed:
        raise argparse.ArgumentTypeError(
            f"CPU {n} is not one this process may use ({', '.join(map(str, allowed))})")
    return n
