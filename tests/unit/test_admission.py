"""The router's queue discipline: priority first, flows of one priority in
turn, sheddable refused, waiting bounded."""

from __future__ import annotations

import asyncio
import time

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from router.admission.flow_control import Admission
from router.config import RouterConfig
from router.metrics import RouterMetrics
from router.pool.endpoints import Endpoint, LoadSample
from router.state import RouterState
from wire.errors import ApiError


def _admission(ttl: float = 5.0) -> tuple[Admission, Endpoint]:
    cfg = RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://127.0.0.1:9"}]},
        "admission": {"objectives": [{"name": "batch", "priority": -1},
                                     {"name": "chat", "priority": 10}],
                      "flowControl": {"enabled": True, "queueTTLSeconds": ttl}}})
    state = RouterState(cfg)
    ep = state.pool.upsert(Endpoint("http://127.0.0.1:9", healthy=True))
    return Admission(cfg.admission, state, RouterMetrics(state)), ep


def _saturate(ep: Endpoint, on: bool) -> None:
    ep.load = LoadSample(waiting=100 if on else 0, at=time.monotonic())


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
        adm, ep = _admission(ttl=0.1)
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


def test_bad_slo_header_and_duplicate_objectives() -> None:
    adm, _ = _admission()
    with pytest.raises(ApiError) as err:
        adm.classify(_headers(x_llm_d_slo_ttft_ms="soon"))
    assert err.value.status == 400
    with pytest.raises(ValueError, match="repeated: x"):
        RouterConfig.model_validate({
            "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
            "discovery": {"static": [{"url": "http://127.0.0.1:9"}]},
            "admission": {"objectives": [{"name": "x", "priority": 1},
                                         {"name": "x", "priority": 2}]}})
