"""The simulator's prefix cache: an LRU of fixed-size token blocks keyed by
a chained hash, emitting vLLM-style KV events as blocks come and go."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

ROOT_HASH = 0x5EED


def block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """Chained hashes of every full block: h_i = H(h_{i-1}, tokens of block i)."""
    out = []
    parent = ROOT_HASH
    for start in range(0, len(tokens) - block_size + 1, block_size):
        data = parent.to_bytes(8, "little") + array(
            "Q", (t & 0xFFFFFFFFFFFFFFFF for t in tokens[start:start + block_size])).tobytes()
        parent = xxhash.xxh3_64_intdigest(data)
        out.append(parent)
    return out


@dataclass
class Stored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]


class BlockCache:
    def __init__(self, num_blocks: int, block_size: int,
                 on_stored: Callable[[Stored], None] | None = None,
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
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            self._lru.move_to_end(h)
            n += 1
        return n

    def store(self, hashes: list[int], tokens: list[int]) -> None:
        new_from = None
        for i, h in enumerate(hashes):
            if h in self._lru:
                self._lru.move_to_end(h)
            else:
                self._lru[h] = None
                if new_from is None:
                    new_from = i
        if new_from is not None and self._on_stored:
            bs = self.block_size
            self._on_stored(Stored(
                block_hashes=hashes[new_from:],
                parent_block_hash=hashes[new_from - 1] if new_from else None,
                token_ids=tokens[new_from * bs:len(hashes) * bs]))
        evicted = []
        while len(self._lru) > self.num_blocks:
            evicted.append(self._lru.popitem(last=False)[0])
        if evicted and self._on_removed:
            self._on_removed(evicted)

    def clear(self) -> None:
        self._lru.clear()
