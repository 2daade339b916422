"""A scale run's report: ``result.json`` (everything, for machines),
``report.md`` (tables a person reads at a glance) and PNG plots (pods/s
over time per setup, latency CDFs, where groups landed). ``render`` works
from the JSON alone, so ``toposerve scale report DIR`` redraws it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toposerve.localcluster.results import landed_bars, pyplot, save, table, write_json
from toposerve.localcluster.scale.scenario import ALL_DRIVERS

RESULT = "result.json"
REPORT = "report.md"


def _f(x: Any, fmt: str = "{:.1f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _pair(d: dict[str, Any], a: str, b: str) -> str:
    return f"{_f(d.get(a), '{:.2f}')}/{_f(d.get(b), '{:.2f}')}"


def _settings(section: dict[str, Any] | None, sep: str = " ") -> str:
    return ", ".join(f"{k}{sep}{v}" for k, v in sorted((section or {}).items())) or "as shipped"


def _sampled(sc: dict[str, Any]) -> bool:
    """Whether the toposerve setup's scheduler sampled nodes (its extender's
    ``placement.sampledNodes``) rather than scoring every one."""
    return bool(((sc.get("extender") or {}).get("placement") or {}).get("sampledNodes"))


def markdown(doc: dict[str, Any], pngs: list[str]) -> str:
    sc = doc["scenario"]
    lim = sc["clientLimits"]
    nodes = ", ".join(f"{g['count']:,} {g['profile']}" for g in sc["nodes"])
    missing = [x for x in sc["setups"] if x not in {s["setup"] for s in doc["setups"]}]
    gogc = ", ".join(f"{k} {v}" for k, v in sorted((sc.get("gogc") or {}).items()))
    gogc = gogc or "as shipped"
    lines = [f"# Scale run: {sc['name']}", "", sc.get("description") or "", "",
             f"Nodes: {nodes}. Pods: {doc['setups'][0]['pods'] if doc['setups'] else 0:,} "
             f"(the first {sc['arrival']['unmeasured']:,} not counted in pods/s), arrival rate "
             f"{sc['arrival']['rate'] or 'unpaced'} pods/s. Client limits: scheduler QPS/burst "
             f"{lim['schedulerQps'] or 'default'}/{lim['schedulerBurst'] or 'default'}, "
             f"controller-manager {lim['controllerManagerQps'] or 'default'}/"
             f"{lim['controllerManagerBurst'] or 'default'}; scheduler "
             f"percentageOfNodesToScore "
             f"{sc.get('scheduler', {}).get('percentageOfNodesToScore') or 'adaptive'} "
             f"(with the extender, for the groups' pods: "
             f"{'the same' if _sampled(sc) else 100}; the others as without), feature gates "
             f"{_settings(sc.get('scheduler', {}).get('featureGates'), '=')}. Slices of "
             f"{', '.join(sc.get('drivers') or ALL_DRIVERS)}; "
             f"GOGC {gogc}; kwok node status every "
             f"{sc.get('nodeStatusSeconds') or 600} s; extender placement "
             f"{_settings((sc.get('extender') or {}).get('placement'))}. "
             f"Estimated memory "
             f"{doc['estimate_mib']:,} MiB. Started {doc['started']}.", "",
             *([f"Not run (the run stopped before them): {', '.join(missing)}.", ""]
               if missing else []),
             "## Throughput and latency", ""]
    errors = [f"{s['setup']}: {s['create_errors']} pods not created, e.g. "
              f"{s['first_create_error']}" for s in doc["setups"] if s["create_errors"]]
    errors += [f"{s['setup']}: never bound: " + ", ".join(
        f"{n} {k}" for k, n in sorted(s["unbound_by_kind"].items()))
        for s in doc["setups"] if s.get("unbound_by_kind")]
    def speed(s: dict[str, Any]) -> list[object]:
        ext = s.get("extender_calls") or {}
        return [s["setup"], s["cluster_up_s"], s["slice_publish_s"], f"{s['bound']}/{s['pods']}",
                _f(s["pods_per_s"]),
                *(_pair(s.get(k) or {}, "p50", "p99")
                  for k in ("to_claim_made_s", "to_allocated_s", "to_bound_s")),
                *(_pair(ext.get(v, {}), "p50_ms", "p99_ms") for v in ("filter", "prioritize"))]
    lines.append(table(
        ["setup", "cluster up s", "slices published s", "pods bound", "pods/s",
         "create→claim made p50/p99 s", "create→allocated p50/p99 s", "create→bound p50/p99 s",
         "extender filter p50/p99 ms", "prioritize p50/p99 ms"],
        map(speed, doc["setups"]), "l" + "r" * 9))
    lines += ["", *errors] if errors else []
    phased = [s for s in doc["setups"] if s.get("extender_phases")]
    if phased:
        phases = ("lock", "view", "placement")
        lines += ["", "Where the extender's calls spent their time (p50/p99 ms a call): "
                  "waiting for its state's lock (held by its watches while they apply an "
                  "event), rebuilding its view, and the rest.", "", table(
                      ["setup", *(f"{v} {p}" for v in ("filter", "prioritize") for p in phases)],
                      ([s["setup"], *(_pair(s["extender_phases"].get(f"{v}/{p}", {}),
                                            "p50_ms", "p99_ms")
                                      for v in ("filter", "prioritize") for p in phases)]
                       for s in phased), "l" + "r" * 6)]
    lines += ["", "What each setup ran with, as its parts report it: the nodes "
              "`driver simulate` published for per driver and the scheduler's asked-for "
              "feature gates from its `kubernetes_feature_enabled` metric.", "",
              table(["setup", "nodes published per driver", "scheduler gates"],
                    ([s["setup"], ", ".join(f"{d} {n:,}" for d, n in sorted(
                        (s.get("pools_by_driver") or {}).items())) or "not recorded",
                      _settings(s.get("scheduler_gates"), "=")] for s in doc["setups"]))]
    lines += ["", "## Placement quality", "", table(
        ["setup", "groups in one domain", "of those that could", "groups pending",
         "pods stranded", "pods never placed", "free GPUs", "largest free rack",
         "fragmentation", "KV ms/request (P/D)"],
        ([s["setup"], f"{q['in_one_domain']}/{q['groups']}", q["could_fit_one_domain"],
          q["pending_groups"], q["stranded_pods"], q["never_placed_pods"], q["free_gpus"],
          q["largest_free_rack"], f"{q['fragmentation']:.2f}", _f(q["kv_ms"], "{:.2f}")]
         for s in doc["setups"] for q in [s["placement"]]), "l" + "r" * 9)]
    churned = [s for s in doc["setups"] if s["churn"]]
    if churned:
        lines += ["", "## Churn", "", table(
            ["setup", "pods deleted", "re-created bound", "re-created→bound p50/p99 s",
             "nodes added", "nodes removed", "slices caught up s"],
            ([s["setup"], c["pods_deleted"], c["pods_recreated_bound"],
              _pair(c["recreated_to_bound_s"], "p50", "p99"), c["nodes_added"],
              c["nodes_removed"], c["nodes_published_s"]]
             for s in churned for c in [s["churn"]]), "l" + "r" * 6)]
    worked = [s for s in doc["setups"] if s.get("scheduler")]  # results before it lack it
    if worked:
        points = ("PreFilter", "Filter", "Score", "PreBind", "Bind")
        lines += ["", "## Scheduler attempts and its seconds per extension point", "",
                  "Attempts by result over the measured span (and churn); a pod tried "
                  "again and again shows as unschedulable attempts. Seconds are summed "
                  "over attempts (PreBind and Bind wait on the apiserver; the extender's "
                  "calls fall outside these points).", ""]

        def work(s: dict[str, Any]) -> list[object]:
            w = s["scheduler"]
            a = w["attempts"]
            placed = s["bound"] + (s["churn"] or {}).get("pods_recreated_bound", 0)
            per = sum(a.values()) / placed if placed else None
            return [s["setup"], *(f"{a.get(k, 0):.0f}" for k in
                                  ("scheduled", "unschedulable", "error")),
                    _f(per, "{:.2f}"), *(f"{w['point_s'].get(p, 0):.1f}" for p in points)]
        lines.append(table(["setup", "scheduled", "unschedulable", "error",
                            "attempts per pod bound", *(f"{p} s" for p in points)],
                           map(work, worked), "l" + "r" * (4 + len(points))))
    lines += ["", "## Processes (CPU seconds and peak RSS over the setup)", "",
              table(["setup", "process", "CPU s", "peak RSS MiB"],
                    ([s["setup"], p["process"], p["cpu_s"], p["peak_rss_mib"]]
                     for s in doc["setups"] for p in s["processes"]), "llrr")]
    lines += ["", "## apiserver requests by verb and resource (busiest, per second)", "",
              table(["setup", "verb", "resource", "requests", "per s"],
                    ([s["setup"], r["verb"], r["resource"], f"{r['requests']:.0f}",
                      f"{r['per_s']:.1f}"] for s in doc["setups"]
                     for r in s["apiserver_requests"]), "lllrr")]
    lines += ["", *[f"![{p}]({p})" for p in pngs], ""]
    return "\n".join(lines)


def smoothed(timeline: list[list[float]], bins: int = 120) -> list[tuple[float, float]]:
    """A long run's one-second rates averaged over windows, at most ``bins`` of them."""
    k = max(1, -(-len(timeline) // bins))
    return [(timeline[i][0], sum(r for _, r in timeline[i:i + k]) / len(timeline[i:i + k]))
            for i in range(0, len(timeline), k)]


def plots(doc: dict[str, Any], out: Path) -> list[str]:
    plt = pyplot()
    names = []
    setups = doc["setups"]
    fig, ax = plt.subplots(figsize=(8, 4))
    for s in setups:
        if s["timeline"]:
            t, r = zip(*smoothed(s["timeline"]), strict=True)
            ax.step(t, r, where="post", label=s["setup"])
    ax.set_xlabel("seconds since the first pod was created")
    ax.set_ylabel("pods bound a second")
    ax.set_title("pods/s over time")
    if ax.get_lines():
        ax.legend()
    save(fig, out / "pods_per_s.png")
    names.append("pods_per_s.png")

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, title in zip(axes, ("to_bound_s", "to_allocated_s"),
                              ("creation → bound", "creation → claim allocated"), strict=True):
        for s in setups:
            v = s["cdf"][key]
            if v:
                ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=s["setup"])
        ax.set_xlabel("seconds")
        ax.set_title(title)
        if ax.get_lines():
            ax.legend()
    axes[0].set_ylabel("fraction of pods")
    save(fig, out / "latency_cdf.png")
    names.append("latency_cdf.png")

    if any(s["landed"] for s in setups):
        fig, axes = plt.subplots(1, len(setups), figsize=(5 * len(setups), 4), squeeze=False,
                                 sharey=True)
        groups = sorted({g for s in setups for r in s["landed"].values() for g in r})
        for ax, s in zip(axes[0], setups, strict=True):
            racks = landed_bars(ax, s["landed"], groups, linewidth=0.4)
            ax.set_xticks(range(len(racks)), racks, rotation=90, fontsize=6)
            ax.set_title(s["setup"])
            ax.set_xlabel("rack")
        axes[0][0].set_ylabel("GPUs of each group (one colour a group)")
        fig.suptitle("where the groups landed")
        save(fig, out / "groups_landed.png")
        names.append("groups_landed.png")
    return names


def write(doc: dict[str, Any], out: Path) -> Path:
    write_json(out / RESULT, doc, indent=1)
    return render(out)


class ReportError(ValueError):
    """result.json cannot be read or lacks what the report shows; the
    message is for a person."""


def render(out: Path) -> Path:
    """report.md and the PNGs from ``out``/result.json; the report's path."""
    path = out / RESULT
    try:
        doc = json.loads(path.read_bytes())
    except OSError as err:
        raise ReportError(f"{path}: cannot read: {err.strerror}") from None
    except ValueError as err:  # not JSON, or not UTF-8
        raise ReportError(f"{path}: not valid JSON ({err}); give the result.json a scale "
                          "run wrote") from None
    if not isinstance(doc, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    try:
        md = markdown(doc, plots(doc, out))
    except (KeyError, TypeError, IndexError, AttributeError) as err:
        # a file from another version, or edited by hand
        what = (f"no {err.args[0]!r}" if isinstance(err, KeyError)
                else f"a value of the wrong type ({err})")
        raise ReportError(f"{path}: {what} where the report needs it; give the result.json "
                          "a scale run of this version wrote") from None
    (out / REPORT).write_text(md)
    return out / REPORT
