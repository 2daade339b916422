"""The one writer of measurement output: tables, and matplotlib as an extra."""

from __future__ import annotations

import sys

import pytest

from toposerve.localcluster import results


def test_table_aligns_and_keeps_empty_cells_one_space_wide() -> None:
    md = results.table(["a", "b", "c"], [[1, "", "x"]], "lrl")
    assert md.splitlines() == ["| a | b | c |", "|---|---:|---|", "| 1 | | x |"]


def test_no_matplotlib_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    with pytest.raises(SystemExit) as err:
        results.pyplot()
    assert str(err.value) == "error: the plots need matplotlib: pip install 'toposerve[scale]'"
