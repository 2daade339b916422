"""``toposerve topology``: inspect profiles, write fake sysfs trees, run
discovery, and show a live cluster's domain tree."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from toposerve.topology.config_file import ConfigError
from toposerve.topology.discovery import discover
from toposerve.topology.labels import PRESETS, PROFILE_LABEL, DialectName, from_labels
from toposerve.topology.model import DeviceKind
from toposerve.topology.profiles import bundled_names, load_profile
from toposerve.topology.slice_attributes import device_entry
from toposerve.topology.sysfs import write_profile_sysfs
from toposerve.topology.tree import render_tree


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _profiles(args: argparse.Namespace) -> int:
    for name in bundled_names():
        p = load_profile(name)
        hw = p.hardware()
        print(f"{name:14} {len(hw.devices(DeviceKind.GPU))} GPUs {len(hw.devices(DeviceKind.NIC))}"
              f" NICs  {p.spec.description}")
    return 0


def _show(args: argparse.Namespace) -> int:
    if args.profile:
        try:
            p = load_profile(args.profile)
        except ConfigError as err:
            return _fail(str(err))
        hw = p.hardware()
        if args.json:
            print(json.dumps({"profile": p.name, "hardware": hw.model_dump(mode="json"),
                              "resourceSliceDevices": [device_entry(x) for x in hw.places()]},
                             indent=2))
            return 0
        print(f"{p.name}: {p.spec.description}")
        for numa in hw.numa_nodes:
            print(f"  numa {numa.id} (cpus {numa.cpus})")
            for root in numa.roots:
                print(f"    root {root.name}")
                for d in root.devices:
                    print(f"      {d.name:6} {d.pci_bus_id} {d.model}")
                for sw in root.switches:
                    print(f"      switch {sw.bdf}")
                    for d in sw.devices:
                        extra = f" {d.interface} rdma={d.rdma_device}" if d.interface else ""
                        print(f"        {d.name:6} {d.pci_bus_id} {d.model}{extra}")
        print("  tiers: " + ", ".join(f"{t.name.lower()} {link.bandwidth_gbps:g}GB/s "
                                      f"{link.latency_us:g}us" for t, link in p.links().items()))
        return 0
    from toposerve.kubeapi.typed import CoreV1Api
    from toposerve.localcluster.clusters import ClusterError, api_client
    from toposerve.localcluster.nodes import node_labels

    try:
        labels = node_labels(CoreV1Api(api_client(args.name)))
    except ClusterError as err:
        return _fail(str(err))
    dialect = PRESETS[DialectName(args.dialect)]
    paths = {name: from_labels(name, lab, dialect) for name, lab in labels.items()}
    profiles = {name: lab.get(PROFILE_LABEL, "?") for name, lab in labels.items()}
    print(f"cluster {args.name}: {len(labels)} nodes")
    print(render_tree(paths, profiles))
    return 0


def _fake_sysfs(args: argparse.Namespace) -> int:
    try:
        out = write_profile_sysfs(load_profile(args.profile), args.out)
    except ConfigError as err:
        return _fail(str(err))
    except OSError as err:  # not empty, a file, under a file, not writable
        return _fail(f"--out {args.out}: {err.strerror or err}; give a new or empty directory")
    print(out)
    return 0


def _discover(args: argparse.Namespace) -> int:
    try:
        hw = discover(args.sysfs)
    except (FileNotFoundError, ValueError) as err:
        return _fail(str(err))
    print(json.dumps(hw.model_dump(mode="json"), indent=2))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("topology", help="hardware profiles, discovery and domain trees")
    tsub = p.add_subparsers(dest="topology_command", required=True, metavar="ACTION")

    s = tsub.add_parser("profiles", help="list the bundled hardware profiles")
    s.set_defaults(handler=_profiles)

    s = tsub.add_parser("show", help="show a profile's node, or a running cluster's domain tree")
    s.add_argument("--profile", help="profile name or file; without it, show the cluster --name")
    s.add_argument("--name", default="toposerve", help="local cluster name (default toposerve)")
    s.add_argument("--dialect", default="toposerve", choices=[d.value for d in DialectName])
    s.add_argument("--json", action="store_true", help="machine-readable output (with --profile)")
    s.set_defaults(handler=_show)

    s = tsub.add_parser("fake-sysfs", help="write a fake sysfs tree of one node of a profile")
    s.add_argument("--profile", required=True)
    s.add_argument("--out", required=True, help="a new or empty directory")
    s.set_defaults(handler=_fake_sysfs)

    s = tsub.add_parser("discover", help="discover devices and topology from a sysfs root")
    s.add_argument("--sysfs", default="/sys")
    s.set_defaults(handler=_discover)
