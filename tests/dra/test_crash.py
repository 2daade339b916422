"""Crash safety: the driver SIGKILLed at every named point of prepare and
unprepare, and at random moments, many times over. After each restart the
checkpoint, the CDI specs and the claims' status agree, nothing is left
half-done, and the kubelet's retry ends where it should."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import grpc
import pytest

from harness.dra_gpu import (
    DriverProc,
    GpuEnv,
    create_claim,
    delete_claim,
    our_status,
    wait_slices,
)
from harness.dra_kubelet import Claim
from toposerve.dra_driver.kubeletplugin.checkpoint import ClaimState
from toposerve.dra_driver.kubeletplugin.plugin import POINTS

pytestmark = pytest.mark.cluster


def assert_consistent(d: DriverProc, env: GpuEnv, claims: list[Claim]) -> set[str]:
    """The prepared claims, after checking that every record agrees on them."""
    cp = d.checkpoint_claims()
    assert set(cp.values()) <= {ClaimState.PREPARE_COMPLETED}, cp  # nothing half-done
    prepared = set(cp)
    assert d.cdi.claims() == prepared
    for c in claims:
        assert bool(our_status(env.api, c)) == (c.uid in prepared), c
    leftovers = [*(d.root / "cdi").glob(".*"), *d.plugin_dir.glob(".checkpoint-*")]
    assert not leftovers
    return prepared


def _published(env: GpuEnv, d: DriverProc) -> None:
    """Slices for the scheduler to allocate claims from (then the driver stops)."""
    d.start()
    wait_slices(env.api)
    assert d.stop() == 0


def test_crash_at_every_point(gpu_env: GpuEnv, tmp_path: Path) -> None:
    """Each start checks what the previous crash left, then crashes at the
    next point (so one restart per point)."""
    d = DriverProc(gpu_env, tmp_path)
    _published(gpu_env, d)
    claim = create_claim(gpu_env.api, "crash-points", count=2)
    before: str | None = None  # where the previous process died
    try:
        for point in [*POINTS, None]:
            d.start(crash_at=point)  # recovery runs before the sockets serve
            prepared = assert_consistent(d, gpu_env, [claim])
            # Finished work stays, unfinished work is undone.
            assert prepared == ({claim.uid} if before == "prepare-completed" else set()), before
            if point is None:
                break
            if point.startswith("unprepare"):
                resp = d.kubelet.prepare([claim])[claim.uid]
                assert resp.error == "" and len(resp.devices) == 2
                assert assert_consistent(d, gpu_env, [claim]) == {claim.uid}
                with pytest.raises(grpc.RpcError):
                    d.kubelet.unprepare([claim])
            else:  # the kubelet retries the prepare it never got an answer for
                with pytest.raises(grpc.RpcError):
                    d.kubelet.prepare([claim])
            assert d.wait_exit() == -9, point
            before = point
        # after all that, the kubelet's calls still end where they should
        resp = d.kubelet.prepare([claim])[claim.uid]
        assert resp.error == "" and len(resp.devices) == 2
        assert assert_consistent(d, gpu_env, [claim]) == {claim.uid}
        assert d.kubelet.unprepare([claim]) == {claim.uid: ""}
        assert assert_consistent(d, gpu_env, [claim]) == set()
    finally:
        d.kill()
        delete_claim(gpu_env.api, claim)


def test_crash_at_random_moments(gpu_env: GpuEnv, tmp_path: Path) -> None:
    d = DriverProc(gpu_env, tmp_path)
    _published(gpu_env, d)
    claims = [create_claim(gpu_env.api, f"crash-random-{i}") for i in range(2)]
    rng = random.Random(15)
    try:
        d.start()
        for _ in range(5):
            stop = threading.Event()

            def churn(stop: threading.Event) -> None:
                while not stop.is_set():
                    try:
                        d.kubelet.prepare(claims)
                        d.kubelet.unprepare(claims[: rng.randint(0, 2)])
                    except grpc.RpcError:
                        return

            t = threading.Thread(target=churn, args=(stop,))
            t.start()
            threading.Event().wait(rng.uniform(0.05, 0.5))  # a random moment, not a sync wait
            d.kill()
            stop.set()
            t.join(timeout=30)
            d.start()
            assert_consistent(d, gpu_env, claims)
            for c in claims:  # the kubelet's retries
                assert d.kubelet.prepare([c])[c.uid].error == ""
            assert assert_consistent(d, gpu_env, claims) == {c.uid for c in claims}
        assert d.kubelet.unprepare(claims) == {c.uid: "" for c in claims}
        assert assert_consistent(d, gpu_env, claims) == set()
    finally:
        d.kill()
        for c in claims:
            delete_claim(gpu_env.api, c)
