"""vLLM KV-cache events, encoded (by the simulator) and decoded (by the
router's precise prefix index) here, in both encodings: older vLLM sends
each event as a positional array with its tag first, newer vLLM as a map
with a ``"type"`` key. Decoded block hashes may be ints or bytes; we keep
their low 64 bits."""

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


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[int]


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


_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
    "BlockRemoved": ("block_hashes",),
    "AllBlocksCleared": (),
}


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
                           block_size=int(fields.get("block_size") or 0))
    if tag == "BlockRemoved":
        return BlockRemoved(block_hashes=[low64(h) for h in fields.get("block_hashes") or []])
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


# fields the map encoding's vLLM added after the array encoding's six; every
# one is written, null here (no LoRA, no extra hash keys, one KV cache group)
# as vLLM writes them, and strict decoders want them all
_MAP_ONLY_STORED = {"lora_name": None, "extra_keys": None, "group_idx": None}


def encode_stored(s: BlockStored, enc: EventEncoding) -> Any:
    # the decoder's field order is the array encoding's positions
    fields = {k: getattr(s, k) for k in _FIELDS["BlockStored"]} | {"lora_id": None,
                                                                   "medium": "GPU"}
    if enc == EventEncoding.MAP:
        return {"type": "BlockStored", **fields, **_MAP_ONLY_STORED}
    return ["BlockStored", *fields.values()]


def encode_removed(hashes: list[int], enc: EventEncoding) -> Any:
    fields = dict(zip(_FIELDS["BlockRemoved"], [hashes], strict=True)) | {"medium": "GPU"}
    if enc == EventEncoding.MAP:
        return {"type": "BlockRemoved", **fields, "group_idx": None}
    return ["BlockRemoved", *fields.values()]


def encode_cleared(enc: EventEncoding) -> Any:
    return {"type": "AllBlocksCleared"} if enc == EventEncoding.MAP else ["AllBlocksCleared"]
