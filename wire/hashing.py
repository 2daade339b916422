"""Chained block hashes: block i's key is xxh3-64 of its bytes seeded with
block i-1's key, so equal keys mean equal prefixes. Only full blocks count."""

from __future__ import annotations

from array import array

import xxhash

SEED = 0x70505E


def byte_block_hashes(data: bytes, block_bytes: int, parent: int = SEED) -> list[int]:
    mv = memoryview(data)
    h, out = parent, []
    digest = xxhash.xxh3_64_intdigest
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        h = digest(mv[start:start + block_bytes], h)
        out.append(h)
    return out


def token_bytes(tokens: list[int]) -> bytes:
    """Token ids as 8-byte words, converted once rather than per block."""
    try:
        return array("Q", tokens).tobytes()
    except OverflowError:  # a negative id: keep its low 64 bits, as vLLM's hashes do
        return array("Q", [t & 0xFFFFFFFFFFFFFFFF for t in tokens]).tobytes()


def token_block_hashes(tokens: list[int], block_size: int, parent: int = SEED) -> list[int]:
    """Keys of full token blocks, continuing the chain after ``parent``."""
    return byte_block_hashes(token_bytes(tokens), block_size * 8, parent)
