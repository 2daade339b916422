"""``toposerve scale run`` end to end on real local clusters: the built-in
small scenario (every workload kind, every setup) and its report, checked
for every figure; and an interrupted run that tears everything down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
import yaml

from harness.waiting import wait_for
from toposerve.localcluster.cluster import running_clusters
from toposerve.localcluster.clusters import cluster_dir
from toposerve.localcluster.scale.scenario import Setup, builtins

pytestmark = pytest.mark.cluster
# never the session cluster's own name: the checks below look for leftovers by prefix
PREFIX = (os.environ.get("TOPOSERVE_TEST_CLUSTER", "ts") + "-scale")[:20]


def _scale(*args: str) -> list[str]:
    return [sys.executable, "-m", "toposerve.main", "scale", "run", *args]


# about 90 s on a quiet machine; six minutes were seen with a load average of 15
@pytest.mark.timeout(1000)
def test_small_scenario_reports_every_figure_for_every_setup(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = subprocess.run(_scale("-f", "small", "--out", str(out), "--prefix", PREFIX,
                              "--progress"), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "bound:" in r.stderr  # the progress bar
    doc = json.loads((out / "result.json").read_text())
    setups = {s["setup"]: s for s in doc["setups"]}
    assert set(setups) == {s.value for s in Setup}
    for name, s in setups.items():
        assert s["create_errors"] == 0, s["first_create_error"]
        assert s["bound"] == s["pods"] == 78, name  # the small scenario fits in every setup
        assert s["slice_publish_s"] > 0 and s["cluster_up_s"] > 0
        assert set(s["pools_by_driver"]) == {"gpu.toposerve.io", "net.toposerve.io"}
        assert min(s["pools_by_driver"].values()) >= 48 and s["scheduler_gates"] == {}
        assert s["pods_per_s"] > 0 and s["timeline"]
        # scheduler_perf's order: the measured pods come once the unmeasured are bound
        assert 0 < s["unmeasured_settled_s"] <= s["measured_first_create_s"]
        for key in ("to_bound_s", "to_allocated_s", "to_claim_made_s"):
            assert s[key]["n"] > 0 and 0 < s[key]["p50"] <= s[key]["p99"], (name, key)
        verbs = {(x["verb"], x["resource"]) for x in s["apiserver_requests"]}
        assert ("POST", "pods") in verbs and ("POST", "pods/binding") in verbs
        procs = {p["process"] for p in s["processes"]}
        assert {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                "kwok-controller", "driver simulate"} <= procs
        assert all(p["peak_rss_mib"] > 0 for p in s["processes"])
        q = s["placement"]
        assert q["groups"] == 5 and q["could_fit_one_domain"] == 5
        assert q["pending_groups"] == q["stranded_pods"] == 0
        assert q["kv_ms"] is not None and q["free_gpus"] > 0
        w = s["scheduler"]
        assert w["attempts"]["scheduled"] >= 78 and w["point_s"]["Filter"] > 0, w
        c = s["churn"]
        assert c["pods_recreated_bound"] == c["pods_deleted"] == 6
        assert c["nodes_added"] == c["nodes_removed"] == 2
    ours = setups["toposerve"]
    assert "extender" in {p["process"] for p in ours["processes"]}
    for verb in ("filter", "prioritize"):
        call = ours["extender_calls"][verb]
        assert call["calls"] > 0 and 0 < call["p50_ms"] <= call["p99_ms"]
    # the extender and the in-tree gangs keep every group in one rack
    assert setups["toposerve"]["placement"]["in_one_domain"] == 5
    assert setups["in-tree"]["placement"]["in_one_domain"] == 5
    md = (out / "report.md").read_text()
    for heading in ("Throughput and latency", "Placement quality", "Churn",
                    "Scheduler attempts", "Processes", "apiserver requests"):
        assert f"## {heading}" in md
    for png in ("pods_per_s.png", "latency_cdf.png", "groups_landed.png"):
        assert (out / png).stat().st_size > 1000
        assert f"]({png})" in md
    assert not [n for n in running_clusters() if n.startswith(PREFIX)]


@pytest.mark.timeout(600)
def test_gpu_driver_alone_and_a_scheduler_gate_are_what_the_run_reports(tmp_path: Path) -> None:
    """The figures say what ran: slices of the drivers asked for only, and
    the gate as the scheduler itself reports it; the extender ran with the
    scenario's placement settings, and --keep-logs kept every log."""
    f = tmp_path / "gate.yaml"
    f.write_text(yaml.safe_dump({
        "apiVersion": "toposerve.io/v1", "kind": "ScaleScenario", "name": "gate",
        "nodes": [{"profile": "hgx-h100", "count": 2, "partitioned": 0}],
        "workload": [{"kind": "claim", "shape": "one-gpu", "count": 6}],
        "setups": ["toposerve"], "drivers": ["gpu.toposerve.io"],
        "scheduler": {"featureGates": {"SchedulerPreQueueingHints": True}},
        "extender": {"placement": {"packUngrouped": False}}, "nodeStatusSeconds": 700,
        "arrival": {"settleSeconds": 5, "timeoutSeconds": 180}}))
    out = tmp_path / "out"
    r = subprocess.run(_scale("-f", str(f), "--out", str(out), "--prefix", f"{PREFIX}-gate",
                              "--no-progress", "--keep-logs"), capture_output=True, text=True,
                       timeout=500)
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = json.loads((out / "result.json").read_text())["setups"]
    assert s["bound"] == s["pods"] == 6
    assert s["pools_by_driver"] == {"gpu.toposerve.io": 2}
    assert s["scheduler_gates"] == {"SchedulerPreQueueingHints": True}
    md = (out / "report.md").read_text()
    assert "| toposerve | gpu.toposerve.io 2 | SchedulerPreQueueingHints=True |" in md
    assert "kwok node status every 700 s; extender placement " in md
    assert "packUngrouped False" in md
    logs = out / "logs" / "toposerve"
    ext = yaml.safe_load((logs / "extender.yaml").read_text())
    assert ext["placement"] == {"packUngrouped": False}
    for component in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager",
                      "kwok-controller", "extender", "driver-simulate"):
        assert (logs / f"{component}.log").stat().st_size > 0, component
    # the scheduler's own log (it runs alone: no lease to acquire)
    assert "Serving securely on 127.0.0.1:" in (logs / "kube-scheduler.log").read_text()
    # kwok as kwokctl configured it: each node's status patch 700 to 770 s apart
    beat = next(d for d in yaml.safe_load_all((logs / "kwok.yaml").read_text())
                if d and d.get("kind") == "Stage"
                and d["metadata"]["name"] == "node-heartbeat-with-lease")
    assert beat["spec"]["delay"] == {"durationMilliseconds": 700_000,
                                     "jitterDurationMilliseconds": 770_000}


def _leftovers(name: str) -> list[str]:
    """Command lines of the cluster's processes (components, the extender,
    which reads its kubeconfig) and of its simulator (``--cluster name``)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(str(cluster_dir(name)) in c for c in cmd) or ("simulate" in cmd and name in cmd):
            found.append(" ".join(cmd))
    return found


def test_interrupted_run_tears_everything_down(tmp_path: Path) -> None:
    doc = yaml.safe_load(builtins()["small"].read_text())
    doc.update(name="interrupted", setups=["toposerve"])
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    prefix = f"{PREFIX}-int"
    name = f"{prefix}-toposerve"
    proc = subprocess.Popen(_scale("-f", str(f), "--out", str(tmp_path / "out"), "--prefix",
                                   prefix, "--no-progress"), stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: list[str] = []
    stderr = proc.stderr
    assert stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(stderr.readline, "")),
                              daemon=True)
    reader.start()
    try:
        # interrupt once the cluster, the simulator and the extender all run
        wait_for("the run to publish slices", lambda: any("slices for" in x for x in lines),
                 timeout=180, interval=0.2)
        wait_for("the extender to start",
                 lambda: any(" extender " in c for c in _leftovers(name)), timeout=60)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    assert any("deleted" in x for x in lines), "".join(lines)[-2000:]
    assert name not in running_clusters()
    assert _leftovers(name) == []
    assert not cluster_dir(name).exists()
    assert not (tmp_path / "out").exists()
