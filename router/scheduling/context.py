"""What the scheduler knows of one request. Work several plugins need
(hashing a long prompt) is done once here and cached, never per scorer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from router.endpoints import Endpoint
from router.prefix.hashing import byte_block_hashes
from router.tokens import BYTES_PER_TOKEN


@dataclass
class RequestContext:
    model: str | None
    prompt: bytes  # canonical prompt bytes (see router.prompt)
    session: str | None = None
    affinity_url: str | None = None  # endpoint that served the previous response
    prefill: Endpoint | None = None  # a split request's prefill endpoint, once picked
    _byte_blocks: dict[int, list[int]] = field(default_factory=dict)
    _tokens: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def token_estimate(self) -> int:
        return len(self.prompt) // BYTES_PER_TOKEN + 1

    def byte_blocks(self, block_bytes: int) -> list[int]:
        keys = self._byte_blocks.get(block_bytes)
        if keys is None:
            keys = self._byte_blocks[block_bytes] = byte_block_hashes(self.prompt, block_bytes)
        return keys
