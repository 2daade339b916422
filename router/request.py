"""What the scheduler knows of one request. Work that depends on the
prompt alone (its block hashes, its token keys) is done once here and
cached for every stage and plugin; work that depends on the candidates
belongs to a scheduling cycle (``toposerve.router.scheduling.cycle``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toposerve.router.pool.endpoints import Endpoint
from toposerve.wire.hashing import byte_block_hashes
from toposerve.wire.tokens import BYTES_PER_TOKEN


@dataclass
class RequestContext:
    model: str | None
    prompt: bytes  # canonical prompt bytes (see toposerve.wire.prompt)
    # a chat request's document: the precise index renders its chat template
    chat: Mapping[str, Any] | None = None
    session: str | None = None
    affinity_url: str | None = None  # endpoint that served the previous response
    prefill: Endpoint | None = None  # a split request's prefill endpoint, once picked
    # the revision it is routed in, once chosen (toposerve.router.pool.revisions; "": unlabelled)
    revision: str | None = None
    # the endpoints (HOST:PORT, as ``Endpoint.name``) a proxy lets it go to: the
    # endpoint picker's subset hint (toposerve.router.epp); None: any
    subset: frozenset[str] | None = None
    _byte_blocks: dict[int, list[int]] = field(default_factory=dict)
    # the prompt's token-block keys for the precise index (one tokenizer and
    # block size per router), set by toposerve.router.prefix.kv_index
    token_keys: list[int] | None = None

    @property
    def token_estimate(self) -> int:
        return len(self.prompt) // BYTES_PER_TOKEN + 1

    def byte_blocks(self, block_bytes: int) -> list[int]:
        keys = self._byte_blocks.get(block_bytes)
        if keys is None:
            keys = self._byte_blocks[block_bytes] = byte_block_hashes(self.prompt, block_bytes)
        return keys
