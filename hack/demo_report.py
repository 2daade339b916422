"""``make demo``, the end: a one-screen summary (where each group landed
and why, what each claim got, TTFT and cache hits against round-robin),
the JSON of it, and two PNGs: the GB200 racks with the groups' pods on
their trays, and TTFT side by side."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from demo_placement import GROUPS, Placed, summary_rows
from demo_serving import SESSIONS, TURNS, Traffic

from toposerve.localcluster.results import pyplot, save, table, write_json
from toposerve.topology.model import DomainPath

FREE = "#e8e8e8"
# a colour per group and role: the wide-EP gang, the P/D set's two roles
COLOURS = {("wide-ep", ""): "#4c72b0", ("pd", "prefill"): "#dd8452", ("pd", "decode"): "#55a868"}


def _tray_index(node: str) -> tuple[str, int]:
    m = re.search(r"(\d+)$", node)
    return (node[:m.start()], int(m.group(1))) if m else (node, 0)


def _racks_png(runs: list[tuple[str, Placed]], paths: dict[str, DomainPath],
               notes: list[str], path: Path) -> None:
    """A row of trays per rack (the rack is the NVLink domain on GB200
    NVL72), one panel per scheduler; each tray coloured by the pod on it."""
    plt = pyplot()
    racks: dict[tuple[str, str], list[str]] = defaultdict(list)
    for node, p in paths.items():
        racks[(p.rack or "?", p.nvlink or "?")].append(node)
    order = sorted(racks)
    width = max(len(v) for v in racks.values())
    fig, axes = plt.subplots(len(runs), 1, figsize=(14, 1.9 + 1.25 * len(order) * len(runs)))
    for ax, (title, placed), note in zip(axes, runs, notes, strict=True):
        on: dict[str, tuple[str, str, str]] = {}  # node -> group, role, short name
        for g in GROUPS:
            for pod, node in placed.nodes[g.name].items():
                role = placed.roles[pod]
                short = pod.removeprefix(g.name + "-").replace("prefill-", "P").replace(
                    "decode-", "D")
                on[node] = (g.name, role, short)
        for row, key in enumerate(order):
            for col, node in enumerate(sorted(racks[key], key=_tray_index)):
                group, role, short = on.get(node, ("", "", ""))
                ax.add_patch(plt.Rectangle((col, -row - 0.9), 0.92, 0.8,
                                           color=COLOURS.get((group, role), FREE)))
                if short:
                    ax.text(col + 0.46, -row - 0.5, short, ha="center", va="center",
                            color="white", fontsize=10, fontweight="bold")
        ax.set_xlim(-0.1, width)
        ax.set_ylim(-len(order) - 0.1, 0.1)
        ax.set_yticks([-r - 0.5 for r in range(len(order))])
        ax.set_yticklabels([f"rack {r}\nNVLink {n}" for r, n in order], fontsize=10)
        ax.set_xticks([c + 0.46 for c in range(width)])
        ax.set_xticklabels([str(c) for c in range(width)], fontsize=8)
        ax.set_xlabel("tray (4 GPUs each)", fontsize=9)
        ax.set_title(f"{title}: {note}", fontsize=11, loc="left")
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in [*COLOURS.values(), FREE]]
    fig.legend(handles, ["wide-EP gang (16 pods)", "P/D: prefill", "P/D: decode", "free"],
               loc="upper center", ncol=4, frameon=False, fontsize=10)
    save(fig, path, rect=(0, 0, 1, 0.93))


def _ttft_png(traffic: list[Traffic], path: Path) -> None:
    """TTFT by turn, TTFT p50/p90 and the cache hit rate, the two side by side."""
    plt = pyplot()
    colours = ["#8c8c8c", "#4c72b0"]
    fig, (by_turn, pct, hits) = plt.subplots(1, 3, figsize=(14, 4.2),
                                             gridspec_kw={"width_ratios": [1.4, 1, 0.8]})
    for t, c in zip(traffic, colours, strict=True):
        means = [statistics.mean(t.ttft_ms[i * SESSIONS:(i + 1) * SESSIONS])
                 for i in range(TURNS)]
        by_turn.plot(range(1, TURNS + 1), means, marker="o", color=c, label=t.name, lw=2)
    by_turn.set_xticks(range(1, TURNS + 1))
    by_turn.set_xlabel("turn of each conversation")
    by_turn.set_ylabel("mean TTFT (ms)")
    by_turn.set_title("TTFT by turn")
    by_turn.set_ylim(bottom=0)
    by_turn.legend()
    for i, (t, c) in enumerate(zip(traffic, colours, strict=True)):
        vals = [t.p(0.5), t.p(0.9)]
        bars = pct.bar([i * 3, i * 3 + 1], vals, color=c, width=0.9)
        pct.bar_label(bars, labels=[f"p50\n{vals[0]:.0f}", f"p90\n{vals[1]:.0f}"], fontsize=9)
    pct.set_xticks([0.5, 3.5])
    pct.set_xticklabels([t.name for t in traffic])
    pct.set_ylim(0, 1.2 * max(t.p(0.9) for t in traffic))
    pct.set_ylabel("TTFT (ms)")
    pct.set_title("TTFT p50 and p90")
    bars = hits.bar([t.name for t in traffic], [100 * t.hit_rate() for t in traffic],
                    color=colours, width=0.6)
    hits.bar_label(bars, fmt="%.0f%%", fontsize=9)
    hits.set_ylim(0, 105)
    hits.set_ylabel("prompt tokens from cache (%)")
    hits.set_title("prefix-cache hits")
    fig.suptitle(f"{SESSIONS} conversations x {TURNS} turns over 3 simulated vLLM servers")
    save(fig, path, rect=(0, 0, 1, 0.95))


def report(out: Path, runs: list[tuple[str, Placed]], paths: dict[str, DomainPath],
           claims: dict[str, list[str]], traffic: list[Traffic], router_where: str) -> None:
    """Print the summary; write demo.json and the two PNGs into ``out``."""
    placement = summary_rows(runs, paths)
    print(table(["group", "placed by", "where it landed", "why"], placement))
    print()
    print(table(["claim", "what it got"], [[c, "; ".join(got)] for c, got in claims.items()]))
    print()
    print(table([f"traffic ({router_where})", "TTFT p50 ms", "TTFT p90 ms", "cache hits",
                 "turns moved"],
                [[t.name, f"{t.p(0.5):.0f}", f"{t.p(0.9):.0f}", f"{100 * t.hit_rate():.0f}%",
                  f"{t.moves}/{SESSIONS * (TURNS - 1)}"] for t in traffic], "lrrrr"))
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "placement": [dict(zip(["group", "placedBy", "where", "why"], r, strict=True))
                      for r in placement],
        "placed": {title: {"seconds": round(p.took_s, 1), "nodes": p.nodes,
                           "decisions": p.decisions} for title, p in runs},
        "claims": claims, "router": router_where, "traffic": [t.doc() for t in traffic]}
    write_json(out / "demo.json", doc)
    notes = [" / ".join(f"{r[0]} {r[2]}" for r in placement if r[1] == title)
             for title, _ in runs]
    _racks_png(runs, paths, notes, out / "demo-racks.png")
    _ttft_png(traffic, out / "demo-ttft.png")
    print(f"\n   wrote {out / 'demo.json'}\n         {out / 'demo-racks.png'}  "
          f"(the GB200 racks, the groups on their trays)\n         {out / 'demo-ttft.png'}  "
          "(TTFT and cache hits, router beside round-robin)")
