"""Chained block hashes: block i's key is xxh3-64 of its bytes seeded with
block i-1's key, so equal keys mean equal prefixes. Only full blocks count."""

from __future__ import annotations

from array import array

import xxhash

SEED = 0x70505E


def byte_block_hashes(data: bytes, block_bytes: int) -> list[int]:
    mv = memoryview(data)
    h, out = SEED, []
    digest = xxhash.xxh3_64_intdigest
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        h = digest(mv[start:start + block_bytes], h)
        out.append(h)
    return out


def token_block_hashes(tokens: list[int], block_size: int, parent: int = SEED) -> list[int]:
    """Keys of full token blocks, continuing the chain after ``parent``."""
    h, out = parent, []
    digest = xxhash.xxh3_64_intdigest
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = digest(array("Q", [t & 0xFFFFFFFFFFFFFFFF
                              for t in tokens[start:start + block_size]]).tobytes(), h)
        out.append(h)
    return out
