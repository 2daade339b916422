"""``toposerve cluster``: a real local Kubernetes cluster with kwok nodes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toposerve.topology.labels import DialectName

# The local cluster is imported by the handlers only: the image leaves it
# out (its pods never start clusters), and `toposerve --help` lists this
# command there too (main says what to install where it runs).
if TYPE_CHECKING:
    from toposerve.localcluster.cluster import ClusterStatus


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def parse_groups(profiles: list[str], nodes: int | None) -> list[tuple[str, int]]:
    """``--profile NAME=COUNT`` (repeatable) or ``--profile NAME --nodes N``."""
    from toposerve.localcluster.clusters import ClusterError

    groups = []
    for item in profiles:
        name, sep, count = item.partition("=")
        if sep:
            if not count.lstrip("-").isdigit():
                raise ClusterError(f"--profile {item}: COUNT must be a whole number")
            groups.append((name, int(count)))
        elif nodes is None:
            raise ClusterError(f"--profile {name}: give --nodes N or write {name}=N")
        else:
            groups.append((name, nodes))
    if not groups:
        raise ClusterError("give --profile NAME (with --nodes N) or --profile NAME=COUNT")
    return groups


def _up(args: argparse.Namespace) -> int:
    from toposerve.localcluster.cluster import ClusterSpec, down, up
    from toposerve.localcluster.clusters import ClusterError
    from toposerve.localcluster.install import InstallError, install
    from toposerve.localcluster.realnode.node import RealNodeError
    from toposerve.localcluster.realnode.node import start as start_real_node
    from toposerve.localcluster.realnode.tools import find_node_tools
    from toposerve.localcluster.tools import ToolsMissing

    try:
        groups = parse_groups(args.profile or [], args.nodes)
        spec = ClusterSpec(name=args.name, groups=groups,
                           scheduler_config=Path(args.scheduler_config)
                           if args.scheduler_config else None,
                           dialect=DialectName(args.dialect), crds=tuple(args.crd or ()))
        if (args.install or args.values or args.set) and not args.real_node:
            raise ClusterError("--install runs the stack's pods on the real node: "
                               "add --real-node")
        if args.real_node:
            find_node_tools()  # fail before the cluster starts, not after
        kubeconfig = up(spec)
        if args.real_node:
            try:
                start_real_node(spec.name)
                if args.install or args.values or args.set:
                    install(spec.name, args.values, args.set or [])
            except BaseException:
                down(spec.name)  # all or nothing, like `up` itself
                raise
        print(kubeconfig)
    except (ClusterError, ToolsMissing, RealNodeError, InstallError) as err:
        return _fail(str(err))
    return 0


def _down(args: argparse.Namespace) -> int:
    from toposerve.localcluster.cluster import down
    from toposerve.localcluster.clusters import ClusterError
    from toposerve.localcluster.realnode.node import RealNodeError
    from toposerve.localcluster.tools import ToolsMissing

    try:
        down(args.name)
    except (ClusterError, ToolsMissing, RealNodeError) as err:
        return _fail(str(err))
    return 0


def _status(args: argparse.Namespace) -> int:
    from toposerve.localcluster.cluster import status
    from toposerve.localcluster.clusters import ClusterError
    from toposerve.localcluster.tools import ToolsMissing

    try:
        clusters = status()
    except (ClusterError, ToolsMissing) as err:
        return _fail(str(err))
    if args.output == "json":
        print(json.dumps([_status_doc(c) for c in clusters], indent=2))
        return 0
    if not clusters:
        print("no local clusters")
    for c in clusters:
        nodes = (f"{c.nodes_ready}/{c.nodes_total} nodes Ready" if c.nodes_total is not None
                 else c.error)
        groups = ", ".join(f"{p}={n}" for p, n in c.groups) or "-"
        real = "".join(f"; real node {n} (kubelet)" for n in c.real_nodes)
        print(f"{c.name}: {nodes}; profiles {groups}{real}; kubeconfig {c.kubeconfig}")
    return 0


def _status_doc(c: ClusterStatus) -> dict[str, Any]:
    """A cluster's status with what is installed on it (the components,
    their pods and phases, the router's URL) when its apiserver answers."""
    from toposerve.localcluster.clusters import api_client
    from toposerve.localcluster.install import install_status

    doc: dict[str, Any] = {"name": c.name, "kubeconfig": c.kubeconfig, "nodesReady": c.nodes_ready,
           "nodesTotal": c.nodes_total, "profiles": dict(c.groups), "realNodes": c.real_nodes,
           "error": c.error}
    if c.nodes_total is not None:
        try:
            doc["install"] = install_status(api_client(c.name))
        except Exception as err:  # report, don't crash: status is for diagnosis
            doc["install"] = {"error": f"{type(err).__name__}: {err}"[:200]}
    return doc


def _kubeconfig(args: argparse.Namespace) -> int:
    from toposerve.localcluster.cluster import running_clusters
    from toposerve.localcluster.clusters import ClusterError, kubeconfig_path
    from toposerve.localcluster.tools import ToolsMissing

    try:
        if args.name not in running_clusters():
            return _fail(f"no cluster named {args.name!r} (see `toposerve cluster status`)")
    except (ClusterError, ToolsMissing) as err:
        return _fail(str(err))
    print(kubeconfig_path(args.name))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("cluster", help="a real local cluster (apiserver, scheduler, kwok nodes)")
    csub = p.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    name_help = "cluster name (default toposerve)"

    s = csub.add_parser("up", help="start a cluster with fake nodes of hardware profiles")
    s.add_argument("--name", default="toposerve", help=name_help)
    s.add_argument("--profile", action="append",
                   help="NAME (with --nodes) or NAME=COUNT; repeat for a mixed cluster")
    s.add_argument("--nodes", type=int, help="node count for a --profile given without =COUNT")
    s.add_argument("--scheduler-config", help="a KubeSchedulerConfiguration file")
    s.add_argument("--dialect", default="toposerve", choices=[d.value for d in DialectName],
                   help="which node labels carry the domain tree")
    s.add_argument("--crd", action="append", metavar="NAME",
                   help="install a CRD another project defines, from its Go module at a pinned "
                        "version (repeatable): inference-pool (the Gateway API Inference "
                        "Extension's InferencePool v1), service-monitor, pod-monitor (the "
                        "Prometheus operator's, for the chart's monitoring values)")
    s.add_argument("--real-node", action="store_true",
                   help="also run one real kubelet node (containerd + runc; root, one per machine)")
    s.add_argument("--install", action="store_true",
                   help="with --real-node: install toposerve's Helm chart on the real node "
                        "as a release, with its local-cluster overlay (the images of `make "
                        "image` imported, never pulled)")
    s.add_argument("-f", "--values", help="with --install: an InstallValues file over the "
                                          "local cluster's values")
    s.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="with --install: a value over the file's (repeatable)")
    s.set_defaults(handler=_up)

    s = csub.add_parser("down", help="stop a cluster and every process it started")
    s.add_argument("--name", default="toposerve", help=name_help)
    s.set_defaults(handler=_down)

    s = csub.add_parser("status", help="list local clusters")
    s.add_argument("-o", "--output", choices=["text", "json"], default="text",
                   help="json: also the installed components, their pods and the router's URL")
    s.set_defaults(handler=_status)

    s = csub.add_parser("kubeconfig", help="print a cluster's kubeconfig path")
    s.add_argument("--name", default="toposerve", help=name_help)
    s.set_defaults(handler=_kubeconfig)
