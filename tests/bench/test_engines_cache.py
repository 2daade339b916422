"""`make engines`' cache (harness/engines.py): what it makes appears whole
or not at all, so a run interrupted while making the tiny model or
installing NIXL leaves nothing the next run would take for cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines import STAMP, _made_once

pytestmark = pytest.mark.unit


def test_made_whole_once_then_cached(tmp_path: Path) -> None:
    dest, calls = tmp_path / "thing", []

    def make(into: Path) -> None:
        calls.append(into)
        into.mkdir()
        (into / "part").write_text("x")

    assert _made_once(dest, "thing", "made", "v1", make) == dest
    assert (dest / "part").read_text() == "x" and (dest / STAMP).read_text() == "v1\n"
    assert calls == [tmp_path / "thing.tmp"] and not calls[0].exists()
    _made_once(dest, "thing", "made", "v1", make)
    assert len(calls) == 1  # cached: not made again


def test_interrupted_making_leaves_no_dest(tmp_path: Path) -> None:
    dest = tmp_path / "thing"

    def broken(into: Path) -> None:
        into.mkdir()
        (into / "half").write_text("x")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        _made_once(dest, "thing", "made", "v1", broken)
    assert not dest.exists()
    # the next run starts from nothing, not from the half-made folder
    _made_once(dest, "thing", "made", "v1", lambda into: into.mkdir())
    assert sorted(p.name for p in dest.iterdir()) == [STAMP]
