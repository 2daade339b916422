"""Token ids for prompts, shared by the simulator and the router's precise
prefix index so both cut the same blocks.

With a Hugging Face ``tokenizer.json`` the real tokenizer is used. Without
one, a byte tokenizer stands in: every 4 bytes of UTF-8 make one token. It
is prefix-stable (a text's tokens start with the tokens of any prefix cut
on a 4-byte boundary) and costs nothing, which is all a simulator needs.
"""

from __future__ import annotations

import sys
from array import array
from typing import Protocol

BYTES_PER_TOKEN = 4


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

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: list[int]) -> str:
        try:
            return str(self._tok.decode(tokens, skip_special_tokens=False))
        except OverflowError:
            raise ValueError("token id out of range") from None

    def count(self, text: str) -> int:
        return len(self.encode(text))


def load_tokenizer(path: str | None) -> Tokenizer:
    return HFTokenizer(path) if path else ByteTokenizer()
