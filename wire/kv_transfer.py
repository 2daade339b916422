"""The prefill/decode hand-over contracts (docs/design.md §6), shared by the router,
which splits requests, and the simulator, which answers them: vLLM
NixlConnector's ``kv_transfer_params`` and SGLang's bootstrap port."""

from __future__ import annotations

from typing import Any

# what a request to a prefill endpoint carries
PREFILL_REQUEST: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None}
# what a decode endpoint needs from the prefill's answer to pull the KV
REMOTE_PREFILL_FIELDS = ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port")
# where an SGLang prefill server waits for decode servers unless told otherwise
SGLANG_BOOTSTRAP_PORT = 8998


def is_hand_over_field(name: str) -> bool:
    """A request body's field that tells a model server where KV comes from
    or goes to: NixlConnector's ``kv_transfer_params``, SGLang's
    ``bootstrap_host``, ``bootstrap_port``, ``bootstrap_room`` (and any other
    ``bootstrap_`` field)."""
    return name == "kv_transfer_params" or name.startswith("bootstrap_")
