"""A printable domain tree of nodes (zone > block > rack > NVLink domain >
node), built from the domain paths the labels give."""

from __future__ import annotations

from collections import defaultdict

from toposerve.topology.model import DomainPath


def render_tree(paths: dict[str, DomainPath], profiles: dict[str, str],
                max_children: int = 6) -> str:
    tree: dict[str, dict[str, dict[str, dict[str, list[str]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list))))
    for node, p in sorted(paths.items()):
        tree[p.zone or "?"][p.block or "?"][p.rack or "?"][p.nvlink or "?"].append(node)
    lines: list[str] = []

    def cut(items: list[str]) -> tuple[list[str], str]:
        if len(items) <= max_children:
            return items, ""
        return items[:max_children], f"... and {len(items) - max_children} more"

    for zone, blocks in tree.items():
        lines.append(f"zone {zone}")
        shown_blocks, more_b = cut(list(blocks))
        for block in shown_blocks:
            racks = blocks[block]
            lines.append(f"  block {block}")
            shown_racks, more_r = cut(list(racks))
            for rack in shown_racks:
                domains = racks[rack]
                n = sum(len(v) for v in domains.values())
                lines.append(f"    rack {rack}  ({len(domains)} NVLink domains, {n} nodes)")
                shown_d, more_d = cut(list(domains))
                for dom in shown_d:
                    nodes = domains[dom]
                    shown_n, more_n = cut(nodes)
                    names = ", ".join(f"{x} [{profiles.get(x, '?')}]" for x in shown_n)
                    lines.append(f"      nvlink {dom}: {names}{' ' + more_n if more_n else ''}")
                if more_d:
                    lines.append(f"      {more_d}")
            if more_r:
                lines.append(f"    {more_r}")
        if more_b:
            lines.append(f"  {more_b}")
    return "\n".join(lines)
