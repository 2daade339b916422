"""docs/simulator.md lists every known difference between the simulator and
vLLM, exactly as the engine tier's comparison allows them
(tests/engine/sim_vs_engine.py), and the flattening that comparison uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.sim_vs_engine import DIFFERENCES, differences, flatten, table

pytestmark = pytest.mark.unit
DOC = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"
HEADING = "## Simulator vs vLLM: every difference\n"


def test_the_doc_lists_every_allowed_difference() -> None:
    text = DOC.read_text()
    assert HEADING in text
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert "\n".join(rows) + "\n" == table(DIFFERENCES), (
        "docs/simulator.md's table must be, as generated:\n" + table(DIFFERENCES))


def test_every_allowed_difference_says_why_once() -> None:
    keys = [d.key for d in DIFFERENCES]
    assert len(keys) == len(set(keys))
    assert all(d.why.strip() for d in DIFFERENCES)


def test_flatten_keeps_types_and_the_values_both_servers_share() -> None:
    body = {"id": "x1", "object": "list", "usage": {"prompt_tokens": 7, "details": None},
            "choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}], "tags": []}
    assert flatten(body) == {
        "id": "str", "object": "str list", "usage.prompt_tokens": "int 7",
        "usage.details": "null", "choices[].index": "int 0|int 1", "choices[].text": "str",
        "tags": "[]"}
    vllm = flatten({"usage": {"prompt_tokens": 7, "prompt_tokens_details": {
        "cached_tokens": 0}}})
    sim = flatten({"usage": {"prompt_tokens": 8}, "refusal": None})
    # null on one side and absent on the other is no difference
    assert differences("chat", vllm, sim) == {
        ("chat", "usage.prompt_tokens", "int 7", "int 8"),
        ("chat", "usage.prompt_tokens_details.cached_tokens", "int 0", "absent")}


def test_an_allowed_difference_matches_by_pattern() -> None:
    (entry,) = [d for d in DIFFERENCES if d.field == "*system_fingerprint"]
    assert entry.allows(("chat stream", "usage.system_fingerprint", "str", "absent"))
    assert not entry.allows(("chat", "body.system_fingerprint", "null", "absent"))
