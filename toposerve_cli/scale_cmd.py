"""``toposerve scale``: run a ScaleScenario on local clusters and report."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from toposerve.topology.config_file import ConfigError


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    from toposerve.localcluster.clusters import ClusterError
    from toposerve.localcluster.scale import report, runner
    from toposerve.localcluster.scale.fit import DoesNotFit
    from toposerve.localcluster.scale.scenario import load_scenario, resolve
    from toposerve.localcluster.tools import ToolsMissing

    try:
        sc = load_scenario(resolve(args.file))
        out = Path(args.out or f"scale-results/{sc.name}")
        with tempfile.TemporaryDirectory(prefix="toposerve-scale-") as tmp:
            runner.run(sc, Path(tmp), prefix=args.prefix,
                       show_bar=(not args.no_progress and sys.stderr.isatty()) or args.progress,
                       done=lambda doc: report.write(doc, out),
                       keep_logs_in=out / "logs" if args.keep_logs else None)
    except (ConfigError, DoesNotFit, ClusterError, ToolsMissing) as err:
        return _fail(str(err))
    print(out / report.REPORT)
    return 0


def _report(args: argparse.Namespace) -> int:
    from toposerve.localcluster.scale import report

    out = Path(args.dir)
    if not (out / report.RESULT).is_file():
        return _fail(f"{out}: no {report.RESULT} (give the --out directory of a scale run)")
    try:
        print(report.render(out))
    except report.ReportError as err:
        return _fail(str(err))
    except OSError as err:  # report.md or a plot cannot be written there
        return _fail(f"{out}: cannot write the report: {err.strerror or err}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from toposerve.localcluster.scale import fit
    from toposerve.localcluster.scale.scenario import builtins, load_scenario

    free = fit.mem_available_mib()
    if args.biggest_fitting:
        sizes = {name: fit.estimate(load_scenario(path)).total_mib
                 for name, path in builtins().items()}
        fitting = [n for n, mib in sizes.items() if mib <= free - fit.RESERVE_MIB]
        if not fitting:
            return _fail(f"no built-in scenario fits in {free:,.0f} MiB available")
        print(max(fitting, key=lambda n: sizes[n]))
        return 0
    for name, path in builtins().items():
        sc = load_scenario(path)
        est = fit.estimate(sc).total_mib
        fits = "fits" if est <= free - fit.RESERVE_MIB else "does not fit"
        print(f"{name:24} {sc.node_count():>6,} nodes {sc.pod_count():>7,} pods "
              f"{', '.join(s.value for s in sc.setups):28} ~{est:>7,.0f} MiB ({fits} now)  "
              f"{sc.description.splitlines()[0] if sc.description else ''}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("scale", help="scale runs on local kwok clusters: throughput, latency, "
                                     "placement quality per scheduler setup")
    inner = p.add_subparsers(dest="scale_command", required=True, metavar="COMMAND")
    r = inner.add_parser("run", help="run a ScaleScenario and write its report")
    r.add_argument("-f", "--file", required=True,
                   help="a ScaleScenario YAML file, or a built-in's name (`scale list`)")
    r.add_argument("--out", help="report directory (default scale-results/<scenario name>)")
    r.add_argument("--prefix", default="ts-scale",
                   help="cluster names are <prefix>-<setup> (default %(default)s)")
    r.add_argument("--keep-logs", action="store_true",
                   help="keep the logs of each setup's processes (control plane, kwok, "
                        "extender, driver simulate) and its scheduler and extender "
                        "configs in <out>/logs/<setup>/, also when the run fails")
    bar = r.add_mutually_exclusive_group()
    bar.add_argument("--no-progress", action="store_true", help="no progress bar")
    bar.add_argument("--progress", action="store_true",
                     help="a progress bar even when stderr is not a terminal")
    r.set_defaults(handler=_run)
    rep = inner.add_parser("report", help="re-render report.md and the plots from result.json")
    rep.add_argument("dir", help="the --out directory of a run")
    rep.set_defaults(handler=_report)
    ls = inner.add_parser("list", help="the built-in scenarios and whether each fits now")
    ls.add_argument("--biggest-fitting", action="store_true",
                    help="print only the name of the biggest one that fits now (make scale)")
    ls.set_defaults(handler=_list)
