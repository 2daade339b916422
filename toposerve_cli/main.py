"""``toposerve``: one command, a subcommand per part."""

from __future__ import annotations

import argparse
import os
import select
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from toposerve import (
    cluster_cmd,
    driver_cmd,
    extender_cmd,
    kubeapi,
    logs,
    manifests_cmd,
    router_cmd,
    scale_cmd,
    sim_cmd,
    topology_cmd,
)
from toposerve.listen import ListenError

# The optional dependencies (pyproject's extras) by the module a part imports.
EXTRAS = {"pyroute2": "net", "tokenizers": "precise", "tqdm": "scale", "psutil": "scale",
          "matplotlib": "scale", "envoy": "epp", "grpc_health": "epp"}


def missing_extra(err: ModuleNotFoundError) -> str | None:
    """The line for a person when ``err`` is an extra that is not installed."""
    module = (err.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    return (f"error: this needs {module}, from the {extra!r} extra: "
            f"pip install 'toposerve[{extra}]'")


def _not_in_image(err: ModuleNotFoundError) -> str | None:
    """The line for a person running ``cluster`` or ``scale`` where the
    local cluster was left out (the image: its pods never start clusters)."""
    if not (err.name or "").startswith("toposerve.localcluster"):
        return None
    return ("error: the local cluster (toposerve cluster, toposerve scale) is not part of this "
            "install (the image leaves it out): run it where toposerve is pip-installed")


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader closed it (``| head``)."""
    poll = select.poll()
    poll.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poll.poll(0))


class _OneLine(argparse.ArgumentParser):
    """A usage error is one line, as every other error is (``--help`` has
    the usage); subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLine(
        prog="toposerve",
        description="Topology-aware serving for large-model inference on Kubernetes.")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    topology_cmd.register(sub)
    cluster_cmd.register(sub)
    sim_cmd.register(sub)
    router_cmd.register(sub)
    extender_cmd.register(sub)
    manifests_cmd.register(sub)
    driver_cmd.register(sub)
    scale_cmd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(args.log_level)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        code = handler(args)
        sys.stdout.flush()  # a reader gone away shows here, not at exit
        return code
    except BrokenPipeError:
        if not _reader_gone():
            raise  # another pipe: a fault, not the end of the output
        # stop quietly, as a tool that SIGPIPE ends does; stdout goes nowhere
        # so the flush at exit is silent too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # the status of a process SIGPIPE ended
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as err:
        line = missing_extra(err) or _not_in_image(err)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    except kubeapi.ConfigError as err:  # no credentials, from any subcommand
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ListenError as err:  # a server's address is taken or not ours
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
