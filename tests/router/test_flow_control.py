"""The flow controller over a real pool and config: priority first, flows
of one priority in turn, sheddable refused as saturation rises, waiting
bounded by TTL and per-band caps, rate limits, warm turns first."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import structlog
from multidict import CIMultiDict, CIMultiDictProxy

from toposerve.router.admission.flow_control import Admission
from toposerve.router.config import RouterConfig
from toposerve.router.metrics import RouterMetrics
from toposerve.router.pool.endpoints import Endpoint, LoadSample
from toposerve.router.state import RouterState
from toposerve.wire.errors import ApiError

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


class Clock:
    # starts at the real clock: a load sample stamped with time.monotonic()
    # is fresh to it (a fixed start read every sample as stale on a machine
    # up for less than that)
    def __init__(self) -> None:
        self.t = time.monotonic()

    def __call__(self) -> float:
        return self.t


def _config(**flow: Any) -> RouterConfig:
    fc: dict[str, Any] = {"enabled": True, "queueTTLSeconds": 5.0,
                          "objectives": [{"name": "batch", "priority": -1},
                                         {"name": "chat", "priority": 10}], **flow}
    return RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://127.0.0.1:9"}]}, "flowControl": fc})


def _admission(chance: float = 0.5, clock: Clock | None = None,
               **flow: Any) -> tuple[Admission, Endpoint]:
    cfg = _config(**flow)
    state = RouterState(cfg)
    ep = state.pool.upsert(Endpoint("http://127.0.0.1:9", healthy=True))
    adm = Admission(cfg.flow_control, state, RouterMetrics(state),
                    clock=clock or time.monotonic, chance=lambda: chance)
    return adm, ep


def _saturate(ep: Endpoint, on: bool, at: float | None = None) -> None:
    ep.load = LoadSample(waiting=100 if on else 0, at=time.monotonic() if at is None else at)


def _headers(**h: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({k.replace("_", "-"): v for k, v in h.items()}))


def test_order_is_priority_then_flows_in_turn() -> None:
    async def go() -> list[str]:
        adm, ep = _admission()
        _saturate(ep, True)
        done: list[str] = []

        async def request(tag: str, **h: str) -> None:
            await adm.admit(adm.classify(_headers(**h)), lambda: [ep])
            done.append(tag)

        tasks = []
        for tag, h in [("a1", {"x_llm_d_inference_fairness_id": "a"}),
                       ("a2", {"x_llm_d_inference_fairness_id": "a"}),
                       ("a3", {"x_llm_d_inference_fairness_id": "a"}),
                       ("b1", {"x_llm_d_inference_fairness_id": "b"}),
                       ("hi", {"x_llm_d_inference_objective": "chat"})]:
            tasks.append(asyncio.create_task(request(tag, **h)))
            await asyncio.sleep(0)  # it runs up to its wait, in the queue
        assert adm.queued == 5 and not done
        _saturate(ep, False)
        for _ in range(5):
            assert adm.release(1) == 1
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return done

    # the high-priority request first; then tenant b is not starved by a's backlog
    assert asyncio.run(go()) == ["hi", "a1", "b1", "a2", "a3"]


def test_no_release_without_room() -> None:
    async def go() -> None:
        adm, ep = _admission()
        _saturate(ep, True)
        t = asyncio.create_task(adm.admit(adm.classify(_headers()), lambda: [ep]))
        await asyncio.sleep(0)  # it runs up to its wait, in the queue
        assert adm.queued == 1
        assert adm.release(10) == 0 and not t.done()
        _saturate(ep, False)
        assert adm.release(10) == 1
        await t

    asyncio.run(go())


def test_sheddable_refused_and_waiting_bounded() -> None:
    async def go() -> None:
        adm, ep = _admission(queueTTLSeconds=0.1)
        _saturate(ep, True)
        with pytest.raises(ApiError) as shed:
            await adm.admit(adm.classify(_headers(x_llm_d_inference_objective="batch")),
                            lambda: [ep])
        assert shed.value.status == 429 and "sheddable" in shed.value.message
        t0 = time.monotonic()
        with pytest.raises(ApiError) as late:
            await adm.admit(adm.classify(_headers()), lambda: [ep])
        assert late.value.status == 429 and time.monotonic() - t0 >= 0.1
        # the SLO header shortens the wait; an endpoint-less pool is a 503
        c = adm.classify(_headers(x_llm_d_slo_ttft_ms="20"))
        assert c.max_wait_s == pytest.approx(0.02)
        eps = [ep]

        async def vanish() -> None:  # the last endpoint goes while the request waits
            while not adm.queued:
                await asyncio.sleep(0)
            eps.clear()

        gone = asyncio.create_task(vanish())
        with pytest.raises(ApiError) as none:
            await adm.admit(c, lambda: eps)
        await gone
        assert none.value.status == 503 and adm.queued == 0
        # with room, sheddable requests go through
        _saturate(ep, False)
        await adm.admit(adm.classify(_headers(x_llm_d_inference_objective="batch")),
                        lambda: [ep])

    asyncio.run(go())


def test_shedding_rises_with_saturation_before_full() -> None:
    """Concurrency detector, 10 slots, shedding from 50%: at 7 in flight
    (70%) a sheddable request is refused when the dice say so (p = 0.4),
    a critical one goes; at or under 50% nothing is shed; full, all is."""
    async def go() -> None:
        for chance, inflight, shed in [(0.39, 7, True), (0.41, 7, False),
                                       (0.0, 5, False), (0.99, 10, True)]:
            adm, ep = _admission(chance=chance, saturation={
                "detector": "concurrency", "maxConcurrency": 10, "shedStart": 0.5})
            ep.inflight = inflight
            eps = [ep]
            batch = adm.classify(_headers(x_llm_d_inference_objective="batch"))
            if shed:
                with pytest.raises(ApiError) as err:
                    await adm.admit(batch, eps.copy)
                assert err.value.status == 429, (chance, inflight)
            else:
                await adm.admit(batch, eps.copy)
                await adm.admit(adm.classify(_headers(x_llm_d_inference_objective="chat")),
                                eps.copy)

    asyncio.run(go())


def test_concurrency_detector_counts_requests_let_go() -> None:
    """Two waiting, one slot frees: only one goes, though the endpoint's
    count has not moved yet (the first has not begun)."""
    async def go() -> None:
        adm, ep = _admission(saturation={"detector": "concurrency", "maxConcurrency": 2})
        ep.inflight = 2
        tasks = [asyncio.create_task(adm.admit(adm.classify(_headers()), lambda: [ep]))
                 for _ in range(2)]
        await asyncio.sleep(0)
        assert adm.queued == 2
        ep.inflight = 1
        assert adm.release(5) == 1 and adm.queued == 1
        await tasks[0]
        ep.inflight = 2  # the first has begun
        assert adm.release(5) == 0
        ep.inflight = 1
        assert adm.release(5) == 1
        await asyncio.gather(*tasks)

    asyncio.run(go())


def test_band_caps_refuse_at_once() -> None:
    async def go() -> None:
        adm, ep = _admission(bands=[{"priority": 0, "maxRequests": 2}])
        _saturate(ep, True)
        waiting = [asyncio.create_task(adm.admit(adm.classify(_headers()), lambda: [ep]))
                   for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(ApiError) as full:
            await adm.admit(adm.classify(_headers()), lambda: [ep])
        assert full.value.status == 429 and "bands[].maxRequests" in full.value.message
        # another band has room of its own
        chat = asyncio.create_task(adm.admit(
            adm.classify(_headers(x_llm_d_inference_objective="chat")), lambda: [ep]))
        await asyncio.sleep(0)
        assert adm.queued == 3
        _saturate(ep, False)
        assert adm.release(3) == 3
        await asyncio.gather(*waiting, chat)

    asyncio.run(go())


def test_warm_turn_before_cold_requests_of_its_band() -> None:
    async def go() -> list[str]:
        clock = Clock()
        adm, ep = _admission(clock=clock, turnPriority={"enabled": True, "warmSeconds": 10})
        # the session's first turn goes with room
        _saturate(ep, False, clock.t)
        await adm.admit(adm.classify(_headers(), session="s1"), lambda: [ep])
        clock.t += 2
        _saturate(ep, True, clock.t)
        done: list[str] = []

        async def request(tag: str, session: str | None) -> None:
            await adm.admit(adm.classify(_headers(), session=session), lambda: [ep])
            done.append(tag)

        tasks = []
        for tag, session in [("cold1", None), ("cold2", "s2"), ("warm", "s1")]:
            tasks.append(asyncio.create_task(request(tag, session)))
            await asyncio.sleep(0)
        _saturate(ep, False, clock.t)
        for _ in tasks:
            assert adm.release(1) == 1
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return done

    assert asyncio.run(go()) == ["warm", "cold1", "cold2"]


def test_tenant_objective_and_rate_limits() -> None:
    async def go() -> None:
        clock = Clock()
        adm, ep = _admission(clock=clock, tenants={"tenants": [
            {"name": "t1", "objective": "batch", "requestsPerSecond": 2},
            {"name": "t3", "maxPriority": 0}]})
        # a capped tenant naming a higher objective runs at its cap
        assert adm.classify(_headers(x_llm_d_inference_objective="chat"),
                            tenant="t3").priority == 0
        assert adm.classify(_headers(x_llm_d_inference_objective="batch"),
                            tenant="t3").priority == -1
        _saturate(ep, False)
        c = adm.classify(_headers(), tenant="t1")
        assert c.priority == -1 and c.flow == "t1"
        # a header still names another objective; the fairness header cannot
        # move a keyed tenant to another flow
        c = adm.classify(_headers(x_llm_d_inference_objective="chat",
                                  x_llm_d_inference_fairness_id="t2"), tenant="t1")
        assert c.priority == 10 and c.flow == "t1"
        for _ in range(2):
            await adm.admit(c, lambda: [ep])
        with pytest.raises(ApiError) as err:
            await adm.admit(c, lambda: [ep])
        assert err.value.status == 429 and "request rate" in err.value.message
        clock.t += 0.5  # one more has come due
        await adm.admit(c, lambda: [ep])

    asyncio.run(go())


def test_bad_slo_header_and_config_errors() -> None:
    adm, _ = _admission()
    with pytest.raises(ApiError) as err:
        adm.classify(_headers(x_llm_d_slo_ttft_ms="soon"))
    assert err.value.status == 400
    with pytest.raises(ValueError, match="repeated: x"):
        _config(objectives=[{"name": "x", "priority": 1}, {"name": "x", "priority": 2}])
    with pytest.raises(ValueError, match="defaultObjective: 'gold' is not in objectives"):
        _config(defaultObjective="gold")
    with pytest.raises(ValueError, match=r"tenants\.tenants\[0\]\.objective: 'gold'"):
        _config(tenants={"tenants": [{"name": "a", "objective": "gold"}]})


def test_old_admission_section_still_loads() -> None:
    with structlog.testing.capture_logs() as logs:
        cfg = RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
            "discovery": {"static": [{"url": "http://127.0.0.1:9"}]},
            "admission": {"objectives": [{"name": "batch", "priority": -1}],
                          "flowControl": {"enabled": True, "queueTTLSeconds": 7}}})
    fc = cfg.flow_control
    assert fc.enabled and fc.queue_ttl_s == 7 and fc.objectives[0].name == "batch"
    assert [e["log_level"] for e in logs if "admission is deprecated" in e["event"]] == [
        "warning"]
    with pytest.raises(ValueError, match="admission is the old place of flowControl"):
        RouterConfig.model_validate({
            "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
            "discovery": {"static": [{"url": "http://127.0.0.1:9"}]},
            "admission": {}, "flowControl": {}})


def test_output_tokens_from_max_tokens_or_expectation() -> None:
    adm, _ = _admission(fairness={"expectedOutputTokens": 10})
    assert adm.classify(_headers(), tokens=100).output_tokens == 10
    assert adm.classify(_headers(), tokens=100, max_tokens=3).output_tokens == 3
