"""What the fuzz suites throw: JSON of any shape (huge numbers, deep
nesting, odd text), raw bytes (broken UTF-8 included), odd methods and
query strings, and the hand-picked bodies every edge gets."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# bounded in count and in time: a loaded 2-core machine answers a request in
# well under a second; a hang shows as the deadline, not as a stuck run
FUZZ = settings(max_examples=400, deadline=10_000, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=16)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
queries = st.sampled_from(["", "?", "?a=1", "?a=%ff%fe", "?x=" + "y" * 2000, "?&&==&",
                           "?limit=-1&order=sideways", "?after=%00"])


def deep(n: int) -> list[bytes]:
    """An array and an object nested ``n`` deep."""
    return [b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n]


# bodies that broke parsers somewhere once: every JSON edge gets them
NASTY: list[bytes] = [
    b"", b"null", b"[]", b"\"x\"", b"0", b"{", b"}", b"\xff\xfe\xfd", b"\xef\xbb\xbf{}",
    b"{\"model\": \"\xc3\x28\"}", b"{\"a\": NaN}", b"{\"a\": Infinity}", b"{\"a\": 1e999}",
    b"{\"a\": " + b"9" * 5000 + b"}", b"{\"a\": -" + b"9" * 5000 + b"}",
    b"{\"a\": \"\\ud800\"}", b"{\"a\": \"\\u0000\"}", b"{\"a\": 1, \"a\": 2}",
    *deep(50_000), *deep(500), b"[" * 100_000, b"\x00" * 1000,
]
