"""The hand-off's CNI calls served by a resident process: the plugin that
containerd execs then only forwards its call over a unix socket, and the
imports and netlink set-up (most of what a NIC pod's exec costs, see
docs/net-handoff.md) are paid once. The server runs the very same
``cni.run``; when it is not there the plugin does the work itself, so a
stopped server changes nothing but the time taken.

One request per connection: a JSON line ``{"env": {CNI_*...}, "conf":
{...}}``; the answer a JSON line ``{"result": ...}`` or ``{"error":
{"code", "msg"}}``."""

from __future__ import annotations

import json
import os
import socketserver
import threading
import time
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import Histogram

from toposerve.dra_driver.net.handoff import cni

log = structlog.get_logger("toposerve.net.handoff")
CALL_SECONDS = Histogram(
    "toposerve_net_handoff_call_seconds",
    "CNI calls the resident hand-off server did, by command and result (ok, error)",
    ["command", "result"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 40))


class HandoffServer:
    """Serves ``cni.run`` on ``socket``; ``host_netns`` as for ``cni.run``."""

    def __init__(self, socket: Path = cni.SERVER_SOCKET, host_netns: str | None = None) -> None:
        self.socket, self.host_netns = socket, host_netns
        self.served = 0
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.wfile.write(json.dumps(outer.answer(self.rfile.readline())).encode()
                                 + b"\n")

        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)  # a dead server's socket
        self._server = socketserver.ThreadingUnixStreamServer(str(socket), Handler)
        os.chmod(socket, 0o600)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="handoff-server", daemon=True)

    def answer(self, line: bytes) -> dict[str, Any]:
        started, command = time.monotonic(), "unknown"
        try:
            req = json.loads(line)
            command = str(req["env"].get("CNI_COMMAND", "unknown"))
            result = cni.run(req["env"], req["conf"], self.host_netns)
        except cni.PluginError as err:
            answer: dict[str, Any] = {"error": {"code": err.code, "msg": str(err)}}
        except Exception as err:
            log.error("hand-off call failed", error=f"{type(err).__name__}: {err}")
            answer = {"error": {"code": 999, "msg": f"{cni.PLUGIN_TYPE}: "
                                                    f"{type(err).__name__}: {err}"}}
        else:
            self.served += 1
            answer = {"result": result}
        CALL_SECONDS.labels(command, "error" if "error" in answer else "ok").observe(
            time.monotonic() - started)
        return answer

    def start(self) -> HandoffServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.socket.unlink(missing_ok=True)
