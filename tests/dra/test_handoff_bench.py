"""The hand-off benchmarks: the netns one runs for one pod of each kind;
the real-node one's reading of containerd's and the driver's logs, on lines
as containerd 2.4 and the driver write them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.net_handoff_realnode import rows, sandboxes


def test_the_benchmark_measures_both_kinds_of_pod(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the benchmark makes network namespaces: needs root")
    from bench import net_handoff

    assert net_handoff.main(["--pods", "1", "--out", str(tmp_path)]) == 0
    rows = {r["what"]: r for r in json.loads((tmp_path / "net_handoff.json").read_text())["rows"]}
    for kind in ("NIC claim", "no NIC claim"):
        assert rows[f"sandbox created -> network ready, {kind}"]["n"] == 1
        assert rows[f"toposerve-nic ADD exec, {kind}"]["p50_ms"] > 0
    assert rows["ip netns exec + toposerve-nic VERSION (no socket)"]["n"] == 1
    assert "| resident mover attach (no exec), NIC claim | 1 |" in \
        (tmp_path / "net_handoff.md").read_text()


LOG = [
    'time="2026-12-01T11:37:08.149964581Z" level=info msg="RunPodSandbox for name:\\"bench-nic-0\\"'
    ' uid:\\"u1\\" namespace:\\"default\\""',
    '{"nic": "enp25s0", "pod_ifname": "net1", "sandbox": "b4b3", "level": "info", '
    '"timestamp": "2026-12-01T11:37:08.406257Z", "msg": "nic attached"}',
    'time="2026-12-01T11:37:08.519773758Z" level=info msg="RunPodSandbox for name:\\"bench-nic-0\\"'
    ' uid:\\"u1\\" namespace:\\"default\\" returns sandbox id \\"b4b3\\""',
    'time="2026-12-01T11:37:10.000000000Z" level=info msg="RunPodSandbox for '
    'name:\\"bench-plain-1\\" uid:\\"u2\\" namespace:\\"default\\""',
    'time="2026-12-01T11:37:10.250000000Z" level=info msg="RunPodSandbox for '
    'name:\\"bench-plain-1\\" uid:\\"u2\\" namespace:\\"default\\" returns sandbox id \\"c5c5\\""',
]


def test_containerds_log_gives_each_sandbox_its_times() -> None:
    got = rows(sandboxes(LOG))
    ready = got["sandbox start -> NIC ready in the netns, NIC claim"]
    assert [round(x, 3) for x in ready] == [0.256]
    assert [round(x, 3) for x in got["sandbox start -> RunPodSandbox returns, NIC claim"]] == \
        [0.37]
    assert got["sandbox start -> RunPodSandbox returns, no NIC claim"] == [0.25]
