"""The scheduling pipeline over plain endpoints: no sockets, no servers."""

from __future__ import annotations

import time

import pytest

from tests.router.pipeline import LONG, ctx, make_state
from toposerve.router.config import RouterConfig
from toposerve.router.pool.endpoints import Endpoint, LoadSample
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.cycle import CycleState
from toposerve.router.scheduling.profile import Decision, Scheduler
from toposerve.router.state import RouterState
from toposerve.topology.model import Affinity, Tier
from toposerve.topology.transfer import DeviceSet, HeldDevice, Transfer, closeness

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def route(sched: Scheduler, c: RequestContext) -> Decision:
    """Schedule, and answer from the first-ranked endpoint, as the proxy
    does when it answers."""
    d = sched.schedule(c)
    d.answered(d.ranked[0])
    return d


@pytest.mark.parametrize("scorers", [
    None,  # the default profile
    [{"type": "prefix-approx", "weight": 1}],
    [{"type": "prefill-cost", "weight": 1}],
])
def test_same_prefix_same_endpoint(scorers: list[dict[str, object]] | None) -> None:
    state = make_state(scorers)
    sched = Scheduler(state, state.config.profile, None)
    first = route(sched, ctx(LONG + "turn 1")).ranked[0]
    for turn in range(2, 6):
        d = route(sched, ctx(LONG + f"turn {turn}"))
        assert d.ranked[0] is first
        assert d.reason in ("prefix-approx", "prefill-cost")
    assert state.approx.held(first.url) > 0


def test_new_work_spreads_by_cache_room() -> None:
    state = make_state()
    sched = Scheduler(state, state.config.profile, None)
    chosen = {route(sched, ctx(f"session {i} " * 3000)).ranked[0].url for i in range(4)}
    assert len(chosen) == 4  # four unrelated sessions, four endpoints


def test_prefill_backlog_moves_work() -> None:
    state = make_state([{"type": "prefill-cost", "weight": 1}])
    sched = Scheduler(state, state.config.profile, None)
    home = route(sched, ctx(LONG + "a")).ranked[0]
    home.prefill_tokens = 10_000_000  # a huge backlog of prefill on the warm endpoint
    assert route(sched, ctx(LONG + "b")).ranked[0] is not home


def test_saturated_and_unhealthy_are_filtered() -> None:
    state = make_state()
    sched = Scheduler(state, state.config.profile, None)
    eps = list(state.pool)
    eps[0].healthy = False
    eps[1].load = LoadSample(waiting=50, at=time.monotonic())
    eps[2].load = LoadSample(at=0.0)  # never scraped: stale, counts as saturated
    for i in range(10):
        assert sched.schedule(ctx(f"p{i}")).ranked[0] is eps[3]
    eps[3].draining = True
    # all that is left is saturated: the filter keeps them rather than refuse
    assert sched.schedule(ctx("x")).ranked[0] in (eps[1], eps[2])


def test_conversations_spread_new_ones_and_expire() -> None:
    from toposerve.router.scheduling.scorers.load import ConversationsScorer

    now = [1000.0]
    state = make_state()
    scorer = ConversationsScorer(state, window_s=300, clock=lambda: now[0])
    eps = state.pool.routable()

    def place(c: RequestContext) -> str:
        scores = scorer.score(c, CycleState(), eps)
        best = max(eps, key=lambda e: (scores[e], -eps.index(e)))
        scorer.picked(c, CycleState(), best)
        return best.url

    system = [f"system prompt of agent {i} " * 60 for i in range(5)]
    # four new conversations land on four endpoints
    first = [place(ctx(system[i] + "task")) for i in range(4)]
    assert len(set(first)) == 4
    e0, e1 = (state.pool.get(u) for u in first[:2])
    assert e0 is not None and e1 is not None
    # more turns (and sub-agents) of one conversation are still one conversation
    for turn in range(5):
        scorer.picked(ctx(system[0] + f"task, turn {turn}"), CycleState(), e0)
    assert len(set(scorer.score(ctx("y"), CycleState(), eps).values())) == 1
    scorer.picked(ctx(system[4] + "task"), CycleState(), e1)  # a fifth conversation
    assert scorer.score(ctx("y"), CycleState(), eps)[e1] == 2 / 3  # two against one
    # a known conversation is never pulled away from where it lives
    assert set(scorer.score(ctx(system[4] + "next turn"), CycleState(), eps).values()) == {1.0}
    now[0] += 299  # inside the window: still live
    assert scorer.score(ctx("y"), CycleState(), eps)[e1] == 2 / 3
    now[0] += 2  # past the window: all forgotten
    scorer.picked(ctx(system[0] + "task, again"), CycleState(), e0)
    # an idle conversation past the window is new again, pruned or not
    assert scorer.score(ctx(system[4] + "next turn"), CycleState(), eps)[e0] == 0.5
    scores = scorer.score(ctx("y"), CycleState(), eps)
    assert scores[e0] == 0.5 and scores[e1] == 1.0  # one against none


def test_near_prefill_scores_by_topology_tier() -> None:
    from toposerve.router.scheduling.scorers.prefill import NearPrefillScorer
    from toposerve.topology.model import DomainPath

    state = make_state()
    rack = {"zone": "z", "block": "b", "rack": "r"}
    prefill = Endpoint(url="http://p:1", path=DomainPath(**rack, nvlink="n0", host="h0"))
    decode = {
        "same-node": DomainPath(**rack, nvlink="n0", host="h0"),
        "nvlink": DomainPath(**rack, nvlink="n0", host="h1"),
        "rack": DomainPath(**rack, nvlink="n1", host="h2"),
        "other-block": DomainPath(zone="z", block="b2", rack="r", nvlink="n0", host="h3"),
        "unknown": None}
    eps = {name: Endpoint(url=f"http://{name}:1", path=path) for name, path in decode.items()}
    c = ctx("x")
    c.prefill = prefill
    scores = NearPrefillScorer(state).score(c, CycleState(), list(eps.values()))
    near = {n: scores[e] for n, e in eps.items()}
    assert near["same-node"] > near["nvlink"] > near["rack"] > near["other-block"] > 0
    assert near["unknown"] == 0.0
    # pods without claims: the node tier, the inside of the node unknown
    assert near["nvlink"] == closeness(Transfer(Tier.NVLINK, Affinity.NVLINK))
    assert near["rack"] == closeness(Transfer(Tier.RACK, Affinity.SAME_NODE))
    c.prefill = None  # not a split request: no preference
    assert set(NearPrefillScorer(state).score(c, CycleState(), list(eps.values())).values()
               ) == {0.0}


def test_near_prefill_tells_apart_decode_pods_of_one_node_by_their_devices() -> None:
    from toposerve.router.scheduling.scorers.prefill import NearPrefillScorer
    from toposerve.topology.model import DeviceKind, DomainPath

    def gpu(name: str, switch: str, root: str, numa: int) -> DeviceSet:
        return DeviceSet((HeldDevice(driver="gpu.toposerve.io", pool="n", name=name,
                                     kind=DeviceKind.GPU, pcie_switch=switch, pcie_root=root,
                                     numa=numa),))

    here = DomainPath(zone="z", block="b", rack="r", host="n")
    prefill = Endpoint(url="http://p:1", path=here, devices=gpu("gpu-0", "s0", "r0", 0))
    eps = [Endpoint(url="http://far:1", path=here, devices=gpu("gpu-4", "s2", "r2", 1)),
           Endpoint(url="http://bare:1", path=here),
           Endpoint(url="http://near:1", path=here, devices=gpu("gpu-1", "s0", "r0", 0))]
    c = ctx("x")
    c.prefill = prefill
    scores = NearPrefillScorer(make_state()).score(c, CycleState(), eps)
    far, bare, near = (scores[e] for e in eps)
    assert near == closeness(Transfer(Tier.SAME_NODE, Affinity.SAME_SWITCH))
    assert near > far == bare == closeness(Transfer(Tier.SAME_NODE, Affinity.SAME_NODE))


def _split_state(min_prefill_tokens: int, scorers: list[dict[str, object]]) -> RouterState:
    state = RouterState(RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://e:1"}]},
        "profile": {"scorers": scorers},
        "disaggregation": {"enabled": True, "minPrefillTokens": min_prefill_tokens}}))
    for i, role in enumerate(["prefill", "prefill", "decode", "decode"]):
        add_endpoint(state, f"http://{role}{i}:8000", role)
    return state


def add_endpoint(state: RouterState, url: str, role: str | None = None) -> Endpoint:
    ep = state.pool.upsert(Endpoint(url=url, role=role, models=frozenset({"m"})))
    ep.healthy = True
    ep.load = LoadSample(at=time.monotonic())
    return ep


@pytest.mark.parametrize("scorer", ["prefix-approx", "prefill-cost"])
def test_pool_change_while_waiting_is_scored_afresh(scorer: str) -> None:
    """What the split check computed before admission is not what the
    prefill stage scores after it: an endpoint that joined meanwhile is
    scored like the others (no KeyError, no missing score)."""
    from toposerve.router.disaggregation.pairing import Disaggregation

    state = _split_state(1, [{"type": scorer, "weight": 1}])
    pd = Disaggregation(state, state.config, None)
    c = ctx(LONG)
    assert pd.worth_splitting(c)  # reads the prefix index over two prefill endpoints
    new = add_endpoint(state, "http://prefill9:8000", "prefill")  # joins during admission
    d = pd.prefill.schedule(c)
    # every endpoint scored is a candidate; the new one is scored (or left
    # out of a sparse scorer's answer: it holds none of the prompt)
    assert new in d.ranked and set(d.scores[scorer]) <= set(d.ranked)
    assert scorer == "prefix-approx" or new in d.scores[scorer]


def test_a_slow_holder_loses_its_session_to_a_faster_endpoint() -> None:
    """The default profile keeps a session where its prefix is, until the
    endpoint's learned speed and backlog predict a wait many times the
    fastest's: then the request goes to the back of that endpoint's
    ranking, whatever the affinity, and the reason says why."""
    state = make_state()
    sched = Scheduler(state, state.config.profile, None)
    home = route(sched, ctx(LONG + "turn 1")).ranked[0]
    for e in state.pool.routable():
        e.prefill_s_per_token = 2e-5
    home.prefill_tokens = 5_000  # the holder's backlog, held like any other
    d = route(sched, ctx(LONG + "turn 2"))
    assert d.ranked[0] is home and d.cycle.wait is None  # 5K tokens at the same speed
    home.prefill_s_per_token = 2e-3  # learned: a hundred times slower
    d = route(sched, ctx(LONG + "turn 3"))
    assert d.ranked[0] is not home and d.ranked[-1] is home
    assert d.reason == "prefill-cost"


@pytest.mark.parametrize("speeds", [
    None,  # none learned yet
    [2e-5, 2.5e-5, 1.6e-5, 2.9e-5],  # like servers, within batching's noise (< 1.5x)
])
def test_like_servers_no_guard(speeds: list[float] | None) -> None:
    """Between servers of like speed no wait is predicted and the work stays
    in tokens (the same scores as before speeds were learned): a backlog
    alone never overrules the affinity, the profile's weights trade them."""
    state = make_state()
    sched = Scheduler(state, state.config.profile, None)
    home = route(sched, ctx(LONG + "turn 1")).ranked[0]
    home.prefill_tokens = 1_000_000
    before = sched.schedule(ctx(LONG + "turn 2")).scores["prefill-cost"]
    for e, v in zip(state.pool.routable(), speeds or [], strict=False):
        e.prefill_s_per_token = v
    d = route(sched, ctx(LONG + "turn 2"))
    assert d.cycle.wait is None and d.ranked[0] is home
    assert d.scores["prefill-cost"] == before


def test_the_guard_can_be_turned_off() -> None:
    state = make_state([{"type": "prefix-approx", "weight": 4},
                        {"type": "prefill-cost", "weight": 1, "params": {"maxSlowdown": 0}}])
    sched = Scheduler(state, state.config.profile, None)
    home = route(sched, ctx(LONG + "turn 1")).ranked[0]
    for e in state.pool.routable():
        e.prefill_s_per_token = 2e-5
    home.prefill_s_per_token, home.prefill_tokens = 2e-3, 5_000
    d = route(sched, ctx(LONG + "turn 2"))
    assert d.cycle.wait is None and d.ranked[0] is home


def test_a_slow_endpoint_gets_fewer_new_conversations() -> None:
    """A conversation's turns keep coming back where it started, and each
    takes four times as long on an endpoint learned four times slower: it
    counts each of its conversations four times over, so new ones go there
    only when the others hold four times as many."""
    state = make_state([{"type": "conversations", "weight": 1}])
    sched = Scheduler(state, state.config.profile, None)
    eps = state.pool.routable()
    for e in eps:
        e.prefill_s_per_token = 2e-5
    slow = eps[0]
    slow.prefill_s_per_token = 8e-5
    placed = [route(sched, ctx(f"conversation {i} " * 200)).ranked[0] for i in range(12)]
    fast = [placed.count(e) for e in eps[1:]]
    assert placed.count(slow) <= 1 and max(fast) - min(fast) <= 1, placed
    slow.prefill_s_per_token = 2.5e-5  # like the others, within batching's noise
    placed = [route(sched, ctx(f"later {i} " * 200)).ranked[0] for i in range(4)]
    assert slow in placed


def test_remembered_scores_follow_the_index_and_the_live_counts() -> None:
    """cache-room and conversations hand out their last answer again while
    the candidates and what they read are the same: a block added to an
    endpoint, or a conversation started on one, is seen by the next
    request, and a caller changing an answer changes no later one."""
    from toposerve.router.scheduling.scorers.load import CacheRoomScorer, ConversationsScorer

    state = make_state()
    eps = state.pool.routable()
    room, convs = CacheRoomScorer(state), ConversationsScorer(state, clock=lambda: 1000.0)
    first = room.score(ctx("a"), CycleState(), eps)
    assert set(first.values()) == {1.0}
    first[eps[0]] = -1.0  # a caller's change
    assert room.score(ctx("a"), CycleState(), eps) == dict.fromkeys(eps, 1.0)
    state.approx.add(eps[0].url, [1, 2, 3])
    assert room.score(ctx("a"), CycleState(), eps)[eps[0]] == 0.0
    assert convs.score(ctx("x" * 2048), CycleState(), eps) == dict.fromkeys(eps, 1.0)
    convs.picked(ctx("y" * 2048), CycleState(), eps[1])  # a new conversation on eps[1]
    assert convs.score(ctx("x" * 2048), CycleState(), eps)[eps[1]] == 0.5
    assert convs.score(ctx("y" * 2048), CycleState(), eps) == dict.fromkeys(eps, 1.0)  # live
