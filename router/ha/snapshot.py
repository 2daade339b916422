"""A snapshot of what replication carries, for a replica that starts beside
a running leader: the latest decision of each (stage, session) and the
most recent session-less ones, as the messages themselves, in the order
they were applied, within a byte budget; and, per sender, the sequence
number of the last message it holds, so the pub/sub stream is applied
from there on with no gap and nothing twice. Plain data, no I/O."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

VERSION = 1


class SnapshotError(ValueError):
    """A snapshot that cannot be used (corrupt, too large, another version)."""


def entry_key(doc: Mapping[str, Any]) -> tuple[str, ...]:
    """Where a decision goes in the log: a session's next decision replaces
    its last (its prompt holds the last one's prefix); the others are each
    their own, until the budget evicts them."""
    session = doc.get("session")
    if isinstance(session, str):
        return ("s", str(doc.get("stage", "")), session)
    return ("m", str(doc.get("from", "")), str(doc.get("seq", "")))


class DecisionLog:
    """The decisions a replica has applied (its own and the others'), most
    recent last; the oldest are left out when its snapshot would be over
    ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, ...], tuple[str, bytes]] = OrderedDict()
        self._senders: Counter[str] = Counter()
        self.bytes = 0  # the entries' JSON with a separator each

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, doc: Mapping[str, Any], raw: bytes) -> None:
        key, sender = entry_key(doc), str(doc.get("from", ""))
        self._drop(key)
        # a copy of its own size: orjson's result keeps the allocation it
        # grew in (a 7-byte message held about 4 KiB), and these live long
        self._entries[key] = (sender, bytes(memoryview(raw)))
        self._senders[sender] += 1
        self.bytes += len(raw) + 1
        while self.bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[str, ...]) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._senders[old[0]] -= 1
            if not self._senders[old[0]]:
                del self._senders[old[0]]
            self.bytes -= len(old[1]) + 1

    def snapshot(self, seqs: Mapping[str, int], of: str | None = None) -> bytes:
        """The log as a snapshot of at most ``max_bytes``, with the
        sequence numbers of the senders it holds (of ``seqs``); ``of``:
        that sender's decisions alone. The messages go in as they are: no
        re-encoding of their block keys."""
        if of is not None:  # a part of the log: within its budget already
            head = orjson.dumps({"version": VERSION,
                                 "seqs": {of: seqs[of]} if of in seqs else {}})[:-1]
            return b"".join((head, b',"entries":[', b",".join(
                raw for sender, raw in self._entries.values() if sender == of), b"]}"))
        while True:
            head = orjson.dumps({"version": VERSION, "seqs": {
                k: v for k, v in seqs.items() if k in self._senders}})[:-1]
            if len(head) + len(b',"entries":[]}') + self.bytes <= self.max_bytes or (
                    not self._entries):
                break
            self._drop(next(iter(self._entries)))
        return b"".join((head, b',"entries":[',
                         b",".join(raw for _, raw in self._entries.values()), b"]}"))


@dataclass
class Snapshot:
    seqs: dict[str, int]
    entries: list[dict[str, Any]]


def decision(e: Any) -> dict[str, Any]:
    """``e``, checked to be a decision as replication carries it (a
    snapshot's entry, a message)."""
    if not (isinstance(e, dict) and isinstance(e.get("url"), str)
            and isinstance(e.get("stage", ""), str) and isinstance(e.get("session"), str | None)):
        raise SnapshotError("not a decision (its url, stage or session)")
    blocks = e.get("blocks") or {}
    if not isinstance(blocks, dict) or not all(
            isinstance(v, list) and all(isinstance(k, int) for k in v) for v in blocks.values()):
        raise SnapshotError("a decision's blocks are not lists of block keys")
    try:
        for size in blocks:
            int(size)
    except ValueError:
        raise SnapshotError("a decision's block size is not a number") from None
    return e


def parse(raw: bytes, max_bytes: int) -> Snapshot:
    """The snapshot in ``raw``, checked whole before any of it is used."""
    if len(raw) > max_bytes:
        raise SnapshotError(f"{len(raw)} bytes, over the limit of {max_bytes} "
                            "(ha.snapshot.maxBytes)")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise SnapshotError(f"not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise SnapshotError("not a JSON object")
    if doc.get("version") != VERSION:
        raise SnapshotError(f"version {doc.get('version')!r}, this router reads {VERSION}")
    seqs, entries = doc.get("seqs"), doc.get("entries")
    if not isinstance(seqs, dict) or not all(isinstance(v, int) for v in seqs.values()):
        raise SnapshotError("seqs is not a map of sender to sequence number")
    if not isinstance(entries, list):
        raise SnapshotError("entries is not a list")
    return Snapshot({str(k): v for k, v in seqs.items()}, [decision(e) for e in entries])
