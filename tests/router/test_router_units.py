"""Pure parts of the router: event decoding, the prefix index, scoring
maths, prompts and config errors, tested without sockets."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.router.pipeline import make_state
from toposerve.router.config import load_router_config
from toposerve.router.pool.endpoints import LEARN_MIN_TOKENS, LEARN_RATE, Endpoint, Pool
from toposerve.router.pool.scrape import (
    KV_USAGE,
    RUNNING,
    WAITING,
    parse_load,
    restarted,
    started_at,
)
from toposerve.router.prefix.index import PrefixIndex
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.scheduling import registry
from toposerve.router.scheduling.pickers import TIE, MaxScorePicker
from toposerve.router.scheduling.plugins import Deps, Scorer
from toposerve.router.scheduling.registry import PluginError
from toposerve.router.scheduling.scoring import (
    Wait,
    decisive,
    lower_is_better,
    totals,
    weighted_total,
)
from toposerve.simulator.kvcache import BlockCache, block_hashes
from toposerve.topology.config_file import ConfigError
from toposerve.wire.hashing import byte_block_hashes, token_block_hashes
from toposerve.wire.kv_events import (
    AllBlocksCleared,
    BadEvent,
    BlockRemoved,
    BlockStored,
    EventEncoding,
    decode_batch,
    encode_cleared,
    encode_removed,
    encode_stored,
)
from toposerve.wire.prompt import chat_prompt
from toposerve.wire.tokens import ByteTokenizer

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


@pytest.mark.parametrize("enc", list(EventEncoding))
def test_event_roundtrip_both_encodings(enc: EventEncoding) -> None:
    stored = BlockStored([1, 2], None, list(range(32)), 16)
    payload = msgpack.packb([1.5, [encode_stored(stored, enc), encode_removed([2], enc),
                                   encode_cleared(enc)], 0])
    assert decode_batch(payload) == [stored, BlockRemoved([2]), AllBlocksCleared()]


def test_event_bytes_hashes_and_short_arrays() -> None:
    # newer vLLM may send bytes hashes; msgspec omits trailing defaults in arrays
    h = (0x1122334455667788).to_bytes(8, "big")
    payload = msgpack.packb([0.0, [["BlockStored", [b"\x00" * 24 + h], None, [1] * 16, 16],
                                   ["SomethingNew", 1]]])
    [ev] = decode_batch(payload)
    assert isinstance(ev, BlockStored) and ev.block_hashes == [0x1122334455667788]


@pytest.mark.parametrize("payload", [b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1]),
                                     msgpack.packb([0, [["BlockStored", [1.5]]]])])
def test_bad_batches(payload: bytes) -> None:
    with pytest.raises(BadEvent):
        decode_batch(payload)


def test_kv_index_rekeys_from_tokens() -> None:
    """Our keys match what a request's tokens give, whatever the engine hashes are."""
    idx = PrefixIndex()
    kv = KVIndex(idx, ByteTokenizer(), 16)
    tokens = list(range(64))
    kv.apply("a", [BlockStored([901, 902], None, tokens[:32], 16),
                   BlockStored([903, 904], 902, tokens[32:], 16)])
    keys = token_block_hashes(tokens, 16)
    assert idx.match(keys, ["a"]) == {"a": 4}
    kv.apply("a", [BlockRemoved([903])])
    assert idx.match(keys, ["a"]) == {"a": 2}
    kv.apply("a", [BlockStored([999], 12345, tokens[:16], 16)])  # unknown parent
    assert kv.orphans == 1
    kv.apply("a", [AllBlocksCleared()])
    assert idx.match(keys, ["a"]) == {"a": 0} and len(idx) == 0


def test_sim_cache_events_match_router_keys() -> None:
    """The simulator's events, decoded and re-keyed, reproduce its cache."""
    idx = PrefixIndex()
    kv = KVIndex(idx, ByteTokenizer(), 16)
    got: list[object] = []
    cache = BlockCache(8, 16, on_stored=got.append,
                       on_removed=lambda hs: got.append(BlockRemoved(hs)))
    a, b = list(range(100)), list(range(48)) + [7] * 80
    for toks in (a, b):
        cache.store(block_hashes(toks, 16), toks)
    kv.apply("x", got)  # type: ignore[arg-type]
    assert len(idx) == len(cache) == 8  # capacity evicted the oldest blocks


def test_prefix_index_match_and_capacity() -> None:
    idx = PrefixIndex(default_capacity=3)
    idx.add("a", [1, 2, 3])
    idx.add("b", [1, 9])
    assert idx.match([1, 2, 3, 4], ["a", "b", "c"]) == {"a": 3, "b": 1, "c": 0}
    idx.add("a", [5])  # evicts the chain's tail (3), not its head
    assert idx.match([1, 2, 3], ["a"]) == {"a": 2}
    idx.add("a", [6, 7])  # now the rest of that chain
    assert idx.match([1, 2, 3], ["a"]) == {"a": 0} and idx.held("a") == 3
    idx.clear("b")
    assert idx.match([1], ["b"]) == {"b": 0}


@given(st.binary(max_size=2000), st.binary(max_size=500))
def test_byte_hashes_are_prefix_stable(a: bytes, b: bytes) -> None:
    ha, hab = byte_block_hashes(a, 64), byte_block_hashes(a + b, 64)
    assert hab[: len(ha)] == ha


@given(st.lists(st.text(max_size=40), min_size=1, max_size=6))
def test_chat_turns_extend_bytes(contents: list[str]) -> None:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": c}
            for i, c in enumerate(contents)]
    for n in range(1, len(msgs)):
        assert chat_prompt(msgs).startswith(chat_prompt(msgs[:n]))


@given(st.dictionaries(st.text(max_size=3), st.floats(0, 1e6), max_size=8))
def test_lower_is_better_in_unit_range(values: dict[str, float]) -> None:
    out = lower_is_better(values)
    assert set(out) == set(values)
    assert all(0.0 <= v <= 1.0 for v in out.values())
    if values:
        assert out[min(values, key=values.get)] == 1.0  # type: ignore[arg-type]


def test_weighted_total_and_decisive() -> None:
    per = {"prefix": {"a": 1.0, "b": 0.0}, "queue": {"a": 0.0, "b": 1.0}}
    w = {"prefix": 3.0, "queue": 1.0}
    assert weighted_total(per, w) == {"a": 3.0, "b": 1.0}
    assert decisive(per, w, "a", "b") == "prefix"
    assert decisive(per, w, "a", None) == "only-candidate"


@given(st.lists(st.lists(st.floats(0, 1), min_size=5, max_size=5), min_size=1, max_size=6),
       st.lists(st.floats(0, 8), min_size=6, max_size=6))
def test_totals_are_the_scorer_by_scorer_sums(rows: list[list[float]],
                                              ws: list[float]) -> None:
    """One pass for every scorer gives the floats adding scorer by scorer
    gives (weighted_total), a scorer that leaves a key out counting 0."""
    keys = list("abcde")
    per = {f"s{i}": dict(zip(keys, row, strict=True)) for i, row in enumerate(rows)}
    per["partial"] = {"c": 0.5, "a": 0.25}  # not in the keys' order, and short
    w = {name: ws[i % len(ws)] for i, name in enumerate(per)}
    assert totals(keys, per, w) == {k: weighted_total(per, w).get(k, 0.0) for k in keys}


@given(st.lists(st.tuples(st.lists(st.floats(0, 1), min_size=6, max_size=6),
                          st.lists(st.booleans(), min_size=6, max_size=6)),
                min_size=1, max_size=6),
       st.lists(st.floats(0, 8), min_size=6, max_size=6))
def test_totals_of_sparse_scorers_are_the_same_floats(rows: list[tuple[list[float],
                                                                       list[bool]]],
                                                      ws: list[float]) -> None:
    """Scorers that leave some keys out (the prefix's holders, the session's
    endpoint), at any place among the others: the same floats, in the
    keys' order, as adding every scorer's score (0 where left out) in
    order."""
    keys = list("abcdef")
    per = {f"s{i}": {k: v for k, v, kept in zip(keys, row, keep, strict=True) if kept}
           for i, (row, keep) in enumerate(rows)}
    w = {name: ws[i % len(ws)] for i, name in enumerate(per)}
    plain = {}
    for k in keys:
        t = 0.0
        for name, scores in per.items():
            t = t + w[name] * scores.get(k, 0.0)
        plain[k] = t
    assert list(totals(keys, per, w).items()) == list(plain.items())


def test_the_picker_orders_by_score_and_ties_at_random() -> None:
    eps = [Endpoint(url=f"http://e{i}:8000") for i in range(6)]
    # two tied at the top (one within float noise), one a TIE below them
    scores = dict(zip(eps, [3.0, 3.0 + 1e-15, 3.0 - TIE, 1.0, 1.0, 0.0], strict=True))
    firsts = []
    for seed in range(200):
        ranked = MaxScorePicker(seed).pick(scores)
        assert set(ranked[:2]) == set(eps[:2]) and ranked[2] is eps[2]
        assert set(ranked[3:5]) == set(eps[3:5]) and ranked[5] is eps[5]
        firsts.append(ranked[0])
    assert 60 < firsts.count(eps[0]) < 140  # each of the tied first about half the time
    assert MaxScorePicker(7).pick(scores) == MaxScorePicker(7).pick(scores)  # seeded


def test_parse_load_vllm_and_sglang() -> None:
    vllm = ('vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0\n')
    load, bs, nb = parse_load(vllm)
    assert (load.waiting, load.running, load.kv_usage, bs, nb) == (3, 2, 0.5, 16, 1000)
    load, bs, nb = parse_load(vllm, cache_info=False)
    assert (load.waiting, load.running, load.kv_usage, bs, nb) == (3, 2, 0.5, None, None)
    sg = 'sglang:num_queue_reqs{model_name="m"} 4\nsglang:token_usage{model_name="m"} 0.25\n'
    load, bs, nb = parse_load(sg)
    assert (load.waiting, load.kv_usage, bs) == (4, 0.25, None)


def test_a_new_start_time_is_a_restart_and_so_is_a_return_where_none_is_told() -> None:
    text = ("# HELP process_start_time_seconds Start time of the process\n"
            "process_start_time_seconds 1.79661045621e+09\n")
    assert started_at(text) == 1.79661045621e+09
    assert started_at('vllm:num_requests_waiting{engine="0"} 0.0\n') is None
    assert not restarted(None, 5.0, was_out=False)  # the first answer
    assert not restarted(5.0, 5.0, was_out=True)  # out of reach, the same process
    assert restarted(5.0, 6.0, was_out=False)  # restarted between two scrapes
    assert restarted(None, None, was_out=True)  # tells no start time: out and back
    assert not restarted(None, None, was_out=False)


_LABEL_VALUE = st.text(alphabet='ab }{,=" \\\n', max_size=8)
_SERIES = [*sorted(WAITING | RUNNING | KV_USAGE), "vllm:num_requests_waiting_by_reason",
           "vllm:kv_cache_usage_perc_total"]


@st.composite
def _exposition(draw: st.DrawFn) -> str:
    """Exposition text mixing the load series with look-alikes: longer names,
    comments that mention them, and label values holding braces, spaces,
    escaped quotes and newlines."""
    lines = []
    for name in draw(st.lists(st.sampled_from(_SERIES), max_size=8)):
        labels = draw(st.dictionaries(st.sampled_from(["engine", "model_name", "x"]),
                                      _LABEL_VALUE, max_size=2))
        esc = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               for k, v in labels.items()}
        body = "{" + ",".join(f'{k}="{v}"' for k, v in esc.items()) + "}" if esc else ""
        value = draw(st.floats(allow_nan=False, allow_infinity=False, width=32))
        stamp = draw(st.sampled_from(["", " 1700000000000"]))
        if draw(st.booleans()):
            lines.append(f"# HELP {name} mentions {name} 9")
        lines.append(f"{name}{body} {value!r}{stamp}")
    return "\n".join(lines) + "\n"


@given(_exposition())
def test_parse_load_agrees_with_the_exposition_parser(text: str) -> None:
    waiting = running = 0.0
    usage = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            waiting += s.value if s.name in WAITING else 0.0
            running += s.value if s.name in RUNNING else 0.0
            usage += [s.value] if s.name in KV_USAGE else []
    load, _, _ = parse_load(text, cache_info=False)
    assert (load.waiting, load.running) == pytest.approx((waiting, running))
    assert load.kv_usage == (max(usage) if usage else 0.0)


def test_parse_load_refuses_a_sample_without_value() -> None:
    with pytest.raises(ValueError, match="without a value"):
        parse_load('vllm:num_requests_waiting{engine="0"}\n')


def _cfg(tmp_path: Path, doc: dict) -> Path:  # type: ignore[type-arg]
    p = tmp_path / "router.yaml"
    p.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
                                 **doc}))
    return p


@pytest.mark.parametrize("doc, fragment", [
    ({}, "discovery: Field required (required: add it)"),
    ({"discovery": {}}, "give discovery.static"),
    ({"discovery": {"static": [{"url": "127.0.0.1:8000"}]}}, "discovery.static.0.url"),
    ({"discovery": {"static": [{"url": "http://a:1"}]}, "server": {"prot": 1}},
     "server.prot: Extra inputs are not permitted (unknown field"),
    ({"discovery": {"static": [{"url": "http://a:1"}]}, "responses": {"backend": "redis"}},
     "needs redisUrl"),
    ({"discovery": {"static": [{"url": "http://a:1"}]},
      "disaggregation": {"protocol": "mooncake"}},
     "disaggregation.protocol: Input should be 'nixl' or 'sglang'"),
    ({"discovery": {"static": [{"url": "http://a:1", "rack": "r1"}]}},
     "discovery.static.0: Value error, nvlinkDomain, rack, block and zone say where a "
     "node sits: set node too"),
    ({"discovery": {"static": [{"url": "http://a:1", "node": "n", "nvlinkDomain": "d",
                                "zone": "z"}]}},
     "discovery.static.0: Value error, set block and rack too"),
    ({"discovery": {"static": [{"url": "http://a:1"}]},
      "disaggregation": {"protocol": "sglang", "minPrefillTokens": 100}},
     "disaggregation: Value error, minPrefillTokens needs protocol: nixl"),
    ({"discovery": {"static": [{"url": "http://a:1"}]}, "profile": {"scorers": [
        {"type": "queue"}, {"type": "session"}, {"type": "queue", "weight": 2}]}},
     "profile: Value error, scorers[2].type: 'queue' is already scorers[0]"),
    ({"discovery": {"static": [{"url": "http://a:1"}]}, "disaggregation": {"decode": {
        "scorers": [{"type": "near-prefill"}, {"type": "near-prefill"}]}}},
     "disaggregation.decode: Value error, scorers[1].type: 'near-prefill' is already"),
    ({"discovery": {"static": [{"url": "http://a:1"}]}, "scrape": {"intervalSeconds": 5}},
     "scrape: Value error, staleAfterSeconds (3) must exceed intervalSeconds + "
     "timeoutSeconds (6); raise staleAfterSeconds above 6"),
])
def test_router_config_errors_name_the_field(tmp_path: Path, doc: dict,  # type: ignore[type-arg]
                                             fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_router_config(str(_cfg(tmp_path, doc)))
    assert fragment in str(err.value)


def test_unknown_plugin_named(tmp_path: Path) -> None:
    from toposerve.router.scheduling.profile import Scheduler
    from toposerve.router.scheduling.registry import PluginError
    from toposerve.router.state import RouterState

    cfg = load_router_config(str(_cfg(tmp_path, {
        "discovery": {"static": [{"url": "http://a:1"}]},
        "profile": {"scorers": [{"type": "prefix-exact"}]}})))
    with pytest.raises(PluginError, match=r"profile\.scorers\[0\]\.type: unknown scorer"):
        Scheduler(RouterState(cfg), cfg.profile, None)
    cfg = load_router_config(str(_cfg(tmp_path, {
        "discovery": {"static": [{"url": "http://a:1"}]},
        "profile": {"scorers": [{"type": "prefix-approx", "params": {"blockBytes": 2}}]}})))
    with pytest.raises(PluginError, match=r"scorers\[0\]\.params\.blockBytes"):
        Scheduler(RouterState(cfg), cfg.profile, None)


def test_decode_profile_errors_name_their_section(tmp_path: Path) -> None:
    from toposerve.router.disaggregation.pairing import Disaggregation
    from toposerve.router.scheduling.registry import PluginError
    from toposerve.router.state import RouterState

    cfg = load_router_config(str(_cfg(tmp_path, {
        "discovery": {"static": [{"url": "http://a:1"}]},
        "disaggregation": {"enabled": True, "decode": {
            "filters": [{"type": "model"}, {"type": "healthy", "params": {"x": 1}}]}}})))
    with pytest.raises(PluginError, match=r"^disaggregation\.decode\.filters\[1\]\.params\.x"):
        Disaggregation(RouterState(cfg), cfg, None)


def test_config_reference_is_current() -> None:
    from toposerve.router.docgen.config import render

    committed = (Path(__file__).parents[2] / "docs" / "router-config.md").read_text()
    assert committed == render(), (
        "run: python -m toposerve.router.docgen.config > docs/router-config.md")


def test_metrics_reference_is_current() -> None:
    from toposerve.router.docgen.metrics import render

    committed = (Path(__file__).parents[2] / "docs" / "router-metrics.md").read_text()
    assert committed == render(), (
        "run: python -m toposerve.router.docgen.metrics > docs/router-metrics.md")


def test_a_model_is_served_by_a_routable_endpoint_that_lists_it_or_lists_none() -> None:
    pool = Pool()
    assert not pool.may_serve("m")  # no endpoint
    a = pool.upsert(Endpoint(url="http://a:1", models=frozenset({"other"})))
    assert not pool.may_serve("m")
    b = pool.upsert(Endpoint(url="http://b:1", models=frozenset({"m"})))
    assert pool.may_serve("m")
    b.draining = True
    assert not pool.may_serve("m")  # draining: not routable
    a.models = frozenset()  # not scraped yet: it might
    assert pool.may_serve("m")


def test_prefill_speed_is_learned_from_first_bytes() -> None:
    ep = Endpoint(url="http://e:1")
    ep.learn_prefill(0.5, LEARN_MIN_TOKENS - 1, 0)  # mostly fixed costs: not a speed
    assert ep.prefill_s_per_token == 0
    ep.learn_prefill(0.01, 10_000, 8_000)  # a backlog: a bound, not a speed
    assert ep.prefill_s_per_token == 0
    ep.learn_prefill(1.0, 10_000, 0)
    assert ep.prefill_s_per_token == pytest.approx(1e-4)  # the first sample, whole
    ep.learn_prefill(3.0, 10_000, 0)
    learned = 1e-4 + LEARN_RATE * 2e-4
    assert ep.prefill_s_per_token == pytest.approx(learned)
    # with a backlog that an engine may have run beside it (a simulator
    # that prices each request alone): under the estimate, it teaches nothing
    ep.learn_prefill(0.02, 10_000, 9_000)
    assert ep.prefill_s_per_token == pytest.approx(learned)
    # slower than the estimate even with the whole backlog first: raised
    ep.learn_prefill(9.0, 10_000, 9_000)
    assert ep.prefill_s_per_token == pytest.approx(learned + LEARN_RATE * (9e-4 - learned))


def test_wait_demotes_only_slow_servers_far_slower() -> None:
    secs = {"a": 0.1, "b": 0.25, "c": 0.5, "d": 1.0, "e": 2.0}
    w = Wait(secs, {"b", "c", "d"}, max_slowdown=3.0, min_extra_s=0.05)
    same = ["b", "a", "c", "d", "e"]
    assert w.demote(same) is same  # the first choice is within 3x: untouched
    # each group in its order; e waits long but is not a slow server: its
    # wait is backlog, which the profile's weights trade against affinity
    assert w.demote(["d", "e", "c", "a", "b"]) == ["e", "a", "b", "d", "c"]
    # the absolute floor: 3x of a tiny wait is still a tiny wait
    tiny = Wait({"a": 0.001, "b": 0.02}, {"b"}, max_slowdown=3.0, min_extra_s=0.05)
    assert tiny.demote(["b", "a"]) == ["b", "a"]


def test_max_slowdown_below_one_is_refused() -> None:
    def make(params: dict[str, float]) -> Scorer:
        return registry.SCORERS.build("prefill-cost", params, "profile.scorers[1]",
                                      Deps(make_state(), None))

    with pytest.raises(PluginError, match=r"scorers\[1\]\.params\.maxSlowdown: .*0 \(off\) or "
                                          r"at least 1"):
        make({"maxSlowdown": 0.5})
    assert make({"maxSlowdown": 0}) is not None
