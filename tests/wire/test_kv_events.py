"""The KV-event decoder and the precise prefix index read vLLM's and SGLang's
frames; the simulator writes what they write."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from tests.wire.fixtures import kv_events as fx
from toposerve.router.prefix.index import PrefixIndex
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.wire.hashing import token_block_hashes
from toposerve.wire.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventEncoding,
    decode_batch,
    encode_cleared,
    encode_removed,
    encode_stored,
)
from toposerve.wire.tokens import ByteTokenizer

URL = "http://ep"
STREAMS = {"vllm-v0.11.0": fx.VLLM_V0_11_0, "vllm-v0.11.0-bytes": fx.VLLM_V0_11_0_BYTES,
           "vllm-v0.33.0": fx.VLLM_V0_33_0, "sglang-v0.5.23": fx.SGLANG_V0_5_23}


def _payload(batch: Any) -> bytes:
    out: bytes = msgpack.packb(batch, use_bin_type=True)  # as msgspec's encoder writes it
    return out


def _index() -> tuple[KVIndex, PrefixIndex]:
    index = PrefixIndex()
    return KVIndex(index, ByteTokenizer(), fx.BLOCK_SIZE), index


def _matched(index: PrefixIndex, tokens: list[int]) -> int:
    return index.match(token_block_hashes(tokens, fx.BLOCK_SIZE), [URL]).get(URL, 0)


@pytest.mark.parametrize("stream", list(STREAMS))
def test_every_event_type_decodes(stream: str) -> None:
    events = [decode_batch(_payload(batch)) for _, _, batch in STREAMS[stream]]
    first = events[0][0]
    assert isinstance(first, BlockStored)
    assert first.parent_block_hash is None and first.block_size == fx.BLOCK_SIZE
    assert first.token_ids == fx.TOKENS[:32] and first.medium == "GPU"
    # int hashes and raw digests both come out as the low 64 bits, as vLLM's int hashes are
    assert first.block_hashes == [fx.H1, fx.H2]
    stored = [e for b in events for e in b if isinstance(e, BlockStored)]
    assert stored[-1].parent_block_hash == fx.H2
    assert any(isinstance(e, BlockRemoved) and e.block_hashes == [fx.H3]
               for b in events for e in b)
    if len(events) > 3:
        assert events[3] == [AllBlocksCleared()]


@pytest.mark.parametrize("stream", list(STREAMS))
def test_the_index_follows_the_engine(stream: str) -> None:
    kv, index = _index()
    frames = STREAMS[stream]
    for _, seq, batch in frames[:2]:
        kv._handle(URL, seq, _payload(batch))
    assert kv.applied[URL] == 1 and kv.orphans == 0 and kv.bad == 0
    assert _matched(index, fx.TOKENS) == 3  # keyed from token ids, not the engine's hashes
    kv._handle(URL, 2, _payload(frames[2][2]))
    assert _matched(index, fx.TOKENS) == 2
    if len(frames) > 3:
        kv._handle(URL, 3, _payload(frames[3][2]))
        assert _matched(index, fx.TOKENS) == 0


def test_an_offloading_tier_does_not_move_the_gpu_index() -> None:
    kv, index = _index()
    for _, seq, batch in fx.VLLM_V0_33_0_OFFLOAD:
        kv._handle(URL, seq, _payload(batch))
    # the CPU copy of block 2 went; the GPU one is still there
    assert _matched(index, fx.TOKENS[:32]) == 2


def test_frames_are_topic_seq_payload() -> None:
    topic, seq, batch = fx.VLLM_V0_33_0[2]
    frames = [topic, seq.to_bytes(8, "big"), _payload(batch)]
    assert int.from_bytes(frames[1], "big") == 2
    assert int.from_bytes((-1).to_bytes(8, "big", signed=True), "big", signed=True) == -1


# --- the simulator's encodings ---------------------------------------------
STORED = BlockStored(block_hashes=[fx.H1, fx.H2], parent_block_hash=None,
                     token_ids=fx.TOKENS[:32], block_size=fx.BLOCK_SIZE)


def test_simulator_map_encoding_is_vllm_v0_33() -> None:
    for tag, ev in (("BlockStored", encode_stored(STORED, EventEncoding.MAP)),
                    ("BlockRemoved", encode_removed([fx.H1], EventEncoding.MAP)),
                    ("AllBlocksCleared", encode_cleared(EventEncoding.MAP))):
        assert ev["type"] == tag
        assert fx.VLLM_V0_33_0_REQUIRED[tag] <= set(ev) <= fx.VLLM_V0_33_0_FIELDS[tag]
        # msgspec's omit_defaults: an optional field is absent, never null
        optional = fx.VLLM_V0_33_0_FIELDS[tag] - fx.VLLM_V0_33_0_REQUIRED[tag]
        assert all(ev[k] is not None for k in optional & set(ev))
    ref = fx.VLLM_V0_33_0[0][2][1][0]
    ev = encode_stored(STORED, EventEncoding.MAP)
    assert {k: v for k, v in ev.items() if k in ref} == {k: ref[k] for k in ev if k in ref}


def test_simulator_array_encoding_is_vllm_v0_11() -> None:
    for tag, ev in (("BlockStored", encode_stored(STORED, EventEncoding.ARRAY)),
                    ("BlockRemoved", encode_removed([fx.H1], EventEncoding.ARRAY)),
                    ("AllBlocksCleared", encode_cleared(EventEncoding.ARRAY))):
        assert ev[0] == tag and len(ev) == 1 + fx.VLLM_V0_11_0_ARITY[tag]
    assert encode_stored(STORED, EventEncoding.ARRAY) == fx.VLLM_V0_11_0[0][2][1][0]
