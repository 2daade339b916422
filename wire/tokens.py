"""Token ids for prompts, shared by the simulator and the router's precise
prefix index so both cut the same blocks.

With a Hugging Face ``tokenizer.json`` the real tokenizer is used. Without
one, a byte tokenizer stands in: every 4 bytes of UTF-8 make one token. It
is prefix-stable (a text's tokens start with the tokens of any prefix cut
on a 4-byte boundary) and costs nothing, which is all a simulator needs.
"""

from __future__ import annotations

import re
import sys
from array import array
from collections import OrderedDict
from typing import Protocol

import structlog

BYTES_PER_TOKEN = 4
log = structlog.get_logger("wire.tokens")
# Pieces of text between special tokens are tokenized once and kept: a
# conversation's every turn brings its earlier messages again, and a
# 15,000-character chat took 7 ms to tokenize whole. Bounded by text
# plus ids held; shorter pieces cost less to tokenize than to look up.
PIECE_CACHE_BYTES = 32 << 20
PIECE_MIN_CHARS = 256
# the first prompts are also tokenized whole and compared: any difference
# (a tokenizer whose pieces are not independent after all) turns the
# pieces off for good
PIECE_CHECKS = 16


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...

    def count(self, text: str) -> int: ...


class ByteTokenizer:
    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8", "surrogatepass")
        words = array("I")  # 4-byte little-endian words; the last one zero-padded
        words.frombytes(data + bytes(-len(data) % BYTES_PER_TOKEN))
        if sys.byteorder != "little":
            words.byteswap()
        return words.tolist()

    def decode(self, tokens: list[int]) -> str:
        """The text again, trailing NUL bytes (the last word's padding)
        dropped; an id that is not a 32-bit value is a ValueError."""
        try:
            words = array("I", tokens)
        except OverflowError:
            raise ValueError("token ids of the byte tokenizer are 32-bit") from None
        if sys.byteorder != "little":
            words.byteswap()
        return words.tobytes().rstrip(b"\0").decode("utf-8", "replace")

    def count(self, text: str) -> int:
        return -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN)


class TokenizerError(ValueError):
    """A tokenizer file that cannot be read or is not a tokenizer."""


class HFTokenizer:
    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer as _T

        try:
            with open(path, "rb"):
                pass
        except OSError as err:
            raise TokenizerError(f"{path}: cannot read the tokenizer: {err.strerror}") from None
        try:
            self._tok = _T.from_file(path)
        except Exception as err:  # the library raises plain Exception for any bad file
            raise TokenizerError(f"{path}: not a Hugging Face tokenizer.json ({err})") from None
        self.path = path
        self._pieces: OrderedDict[str, array[int]] = OrderedDict()
        self._held = 0  # bytes of text and ids in _pieces
        self._checks = PIECE_CHECKS
        self._specials = self._splitter()

    def _splitter(self) -> re.Pattern[str] | None:
        """The added tokens the library cuts a text at before anything else,
        when each piece between them is then tokenized on its own: added
        tokens matched as written (not normalized, no space stripped
        around them, not whole words only), no normalizer. Else None: the
        text is tokenized whole."""
        added = self._tok.get_added_tokens_decoder()
        if not added or self._tok.normalizer is not None or any(
                a.lstrip or a.rstrip or a.single_word or a.normalized for a in added.values()):
            return None
        # longest first: the library takes the longest token at a position
        alternatives = sorted((a.content for a in added.values()), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, alternatives)))

    def _whole(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def _piece(self, text: str, out: list[int]) -> None:
        if (ids := self._pieces.get(text)) is not None:
            self._pieces.move_to_end(text)
            out += ids
            return
        ids = array("I", self._whole(text))
        out += ids
        size = len(text) + ids.itemsize * len(ids)
        if size > PIECE_CACHE_BYTES // 4:
            return  # one piece may not push out most of the others
        self._pieces[text] = ids
        self._held += size
        while self._held > PIECE_CACHE_BYTES:
            old, old_ids = self._pieces.popitem(last=False)
            self._held -= len(old) + old_ids.itemsize * len(old_ids)

    def _long(self, text: str, at: int, start: int, end: int, out: list[int]) -> int:
        """The piece ``text[start:end]`` (between added tokens) from the
        cache when it is long enough to keep, after the text from ``at``
        before it, in one call; returns where the text not yet tokenized
        begins."""
        if end - start < PIECE_MIN_CHARS:
            return at
        if at < start:
            out += self._whole(text[at:start])
        self._piece(text[start:end], out)
        return end

    def encode(self, text: str) -> list[int]:
        """The text's ids, without the tokenizer's own added prefix or
        suffix. Cut at the added tokens (see ``_splitter``): each long piece
        tokenized once while it stays in the cache, the short pieces and
        the added tokens between long ones together in one call (a call
        a short piece cost more than the whole)."""
        split = self._specials
        if split is None:
            return self._whole(text)
        out: list[int] = []
        at = start = 0
        for m in split.finditer(text):
            at = self._long(text, at, start, m.start(), out)
            start = m.end()
        at = self._long(text, at, start, len(text), out)
        if at < len(text):
            out += self._whole(text[at:])
        if self._checks:
            self._checks -= 1
            if out != (whole := self._whole(text)):
                self._specials = None
                self._pieces.clear()
                self._held = 0
                log.warning("tokenizing a text in pieces differs from tokenizing it whole: "
                            "every text is tokenized whole from now on", tokenizer=self.path)
                return whole
        return out

    def decode(self, tokens: list[int]) -> str:
        try:
            return str(self._tok.decode(tokens, skip_special_tokens=False))
        except OverflowError:
            raise ValueError("token id out of range") from None

    def count(self, text: str) -> int:
        return len(self.encode(text))


def load_tokenizer(path: str | None) -> Tokenizer:
    return HFTokenizer(path) if path else ByteTokenizer()
