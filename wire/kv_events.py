"""vLLM KV-cache events, encoded (by the simulator) and decoded (by the
router's precise prefix index) here, in both encodings: older vLLM (v0.11)
sends each event as a positional array with its tag first, newer vLLM
(v0.33) and SGLang (v0.5.23) as a map with a ``"type"`` key; the batch is
an array ``[ts, events, dp_rank]`` in all of them (tests/wire/fixtures).
Decoded block hashes may be ints or bytes; we keep their low 64 bits, as
vLLM's own int hashes do."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgpack

MASK64 = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    medium: str | None = "GPU"  # the cache tier; CPU and disk ones come with offloading


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = "GPU"


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


class BadEvent(ValueError):
    pass


def low64(h: Any) -> int:
    if isinstance(h, int):
        return h & MASK64
    if isinstance(h, bytes | bytearray):
        return int.from_bytes(h[-8:], "big")
    raise BadEvent(f"block hash of type {type(h).__name__}")


# the array encoding's positions after the tag (vLLM v0.11); the map
# encoding has the same names
_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _medium(m: Any) -> str | None:
    return None if m is None else str(m)


def decode_event(raw: Any) -> Event | None:
    """One event; ``None`` for event types we do not use."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = {k: raw.get(k) for k in _FIELDS.get(str(tag), ())}
    elif isinstance(raw, list | tuple) and raw:
        tag = raw[0]
        names = _FIELDS.get(str(tag), ())
        fields = dict(zip(names, raw[1:1 + len(names)], strict=False))
    else:
        raise BadEvent(f"event is neither a map nor a tagged array: {type(raw).__name__}")
    if tag == "BlockStored":
        parent = fields.get("parent_block_hash")
        return BlockStored(block_hashes=[low64(h) for h in fields.get("block_hashes") or []],
                           parent_block_hash=None if parent is None else low64(parent),
                           token_ids=list(fields.get("token_ids") or []),
                           block_size=int(fields.get("block_size") or 0),
                           medium=_medium(fields.get("medium")))
    if tag == "BlockRemoved":
        return BlockRemoved(block_hashes=[low64(h) for h in fields.get("block_hashes") or []],
                            medium=_medium(fields.get("medium")))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_batch(payload: bytes) -> list[Event]:
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError) as err:
        raise BadEvent(f"not msgpack: {err}") from None
    if not isinstance(batch, list | tuple) or len(batch) < 2:
        raise BadEvent("batch is not [ts, events, ...]")
    return [e for e in (decode_event(r) for r in batch[1]) if e is not None]


# --- encoding ---------------------------------------------------------------
class EventEncoding(StrEnum):
    ARRAY = "array"
    MAP = "map"


# what vLLM v0.33 writes in the map encoding beyond the array's fields for a
# plain text prompt: no LoRA, one KV-cache group; its optional fields left
# None are not written at all (msgspec's omit_defaults)
def encode_stored(s: BlockStored, enc: EventEncoding) -> Any:
    fields = {"block_hashes": s.block_hashes, "parent_block_hash": s.parent_block_hash,
              "token_ids": s.token_ids, "block_size": s.block_size, "lora_id": None,
              "medium": s.medium}
    if enc == EventEncoding.MAP:
        return {"type": "BlockStored", **fields, "lora_name": None,
                "extra_keys": [None] * len(s.block_hashes), "group_idx": 0}
    return ["BlockStored", *fields.values()]


def encode_removed(hashes: list[int], enc: EventEncoding) -> Any:
    if enc == EventEncoding.MAP:
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": 0}
    return ["BlockRemoved", hashes, "GPU"]


def encode_cleared(enc: EventEncoding) -> Any:
    return {"type": "AllBlocksCleared"} if enc == EventEncoding.MAP else ["AllBlocksCleared"]
