"""Fixtures written from vLLM's and SGLang's own source (see each file's
_source), read by the router's parsers and compared with the simulator."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def sse_events(text: str) -> list[bytes]:
    """The SSE events of a fixture stream, its ``#`` comment lines dropped."""
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    return [e.encode() + b"\n\n" for e in body.split("\n\n") if e.strip()]
