"""The simulator's prefix cache: an LRU of fixed-size token blocks keyed by
a chained hash, emitting vLLM-style KV events as blocks come and go."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import xxhash

from toposerve.wire.hashing import token_bytes
from toposerve.wire.kv_events import BlockStored

ROOT_HASH = 0x5EED


def block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """Chained hashes of every full block: h_i = H(h_{i-1}, tokens of block i)."""
    raw = token_bytes(tokens)
    step = block_size * 8
    out = []
    parent = ROOT_HASH
    digest = xxhash.xxh3_64_intdigest
    for start in range(0, len(raw) - step + 1, step):
        parent = digest(parent.to_bytes(8, "little") + raw[start:start + step])
        out.append(parent)
    return out


class BlockCache:
    def __init__(self, num_blocks: int, block_size: int,
                 on_stored: Callable[[BlockStored], None] | None = None,
                 on_removed: Callable[[list[int]], None] | None = None) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._on_stored = on_stored
        self._on_removed = on_removed

    def __len__(self) -> int:
        return len(self._lru)

    def cached_prefix(self, hashes: list[int]) -> int:
        """How many leading blocks are cached (and mark them recently used)."""
        n = self.held_prefix(hashes)
        self._touch(hashes[:n])
        return n

    def held_prefix(self, hashes: list[int]) -> int:
        """How many leading blocks are cached, without marking them used."""
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            n += 1
        return n

    def _touch(self, hashes: list[int]) -> None:
        # head last, so it is the most recent: like vLLM, which frees a
        # sequence's blocks tail first, the tail of a prefix is evicted first
        for h in reversed(hashes):
            self._lru[h] = None
            self._lru.move_to_end(h)

    def store(self, hashes: list[int], tokens: list[int]) -> None:
        new_from = next((i for i, h in enumerate(hashes) if h not in self._lru), None)
        self._touch(hashes)
        if new_from is not None and self._on_stored:
            bs = self.block_size
            self._on_stored(BlockStored(
                block_hashes=hashes[new_from:],
                parent_block_hash=hashes[new_from - 1] if new_from else None,
                token_ids=tokens[new_from * bs:len(hashes) * bs], block_size=bs))
        evicted = []
        while len(self._lru) > self.num_blocks:
            evicted.append(self._lru.popitem(last=False)[0])
        if evicted and self._on_removed:
            self._on_removed(evicted)

    def clear(self) -> None:
        self._lru.clear()
