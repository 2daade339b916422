"""A Hugging Face tokenizer cuts a text at its added tokens and tokenizes
each piece on its own, so ``HFTokenizer`` keeps each long piece's ids and
tokenizes only what is new: a conversation's earlier messages come again
every turn. The ids must be what tokenizing the text whole gives, and a
tokenizer whose pieces are not independent must be caught."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.wire.test_chat_template import write_model
from toposerve.wire import tokens
from toposerve.wire.tokens import PIECE_MIN_CHARS, HFTokenizer

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


@pytest.fixture(scope="module")
def chatml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("pieces"), "{{ messages }}", None)


piece = st.text(st.characters(codec="utf-8"), max_size=2 * PIECE_MIN_CHARS) | st.builds(
    lambda w, n: w * n, st.text(st.characters(codec="utf-8"), min_size=1, max_size=9),
    st.integers(PIECE_MIN_CHARS // 4, PIECE_MIN_CHARS))
texts = st.lists(st.tuples(piece, st.sampled_from(["", *SPECIALS])), max_size=6).map(
    lambda ps: "".join(a + b for a, b in ps))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(texts, min_size=1, max_size=4))
def test_pieces_tokenize_as_the_whole(chatml: Path, texts: list[str]) -> None:
    tok = HFTokenizer(str(chatml))
    tok._checks = 0  # no comparison: the pieces alone
    for text in [*texts, *texts]:  # the second time from the cache
        assert tok.encode(text) == tok._whole(text)


def test_a_conversation_is_tokenized_once_per_message(chatml: Path) -> None:
    tok = HFTokenizer(str(chatml))
    system = "You are a helpful assistant. " * 40
    turns = ["What is the weather in Paris today? " * 10, "Call get_weather. " * 20]
    text = ""
    for t in [system, *turns]:
        text += f"<|im_start|>user\n{t}<|im_end|>\n"
        assert tok.encode(text) == tok._whole(text)
    assert len(tok._pieces) == 3  # each message's piece once
    assert tok._specials is not None


def test_a_bounded_cache(chatml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "PIECE_CACHE_BYTES", 20_000)
    tok = HFTokenizer(str(chatml))
    for i in range(40):
        tok.encode(f"message {i}: " + "words of the message " * 30 + "<|im_end|>")
    assert 0 < tok._held <= 20_000
    assert tok._held == sum(len(t) + 4 * len(ids) for t, ids in tok._pieces.items())


def test_pieces_that_are_not_independent_turn_the_pieces_off(tmp_path: Path) -> None:
    """Metaspace with a space put before the first piece only: cut at an
    added token, the second piece would get one too. The comparison of
    the first prompts finds it, answers whole, and stops cutting."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.train_from_iterator(["hello world again and again " * 50],
                            trainers.BpeTrainer(vocab_size=200,
                                                special_tokens=["<unk>", "<sep>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    ours = HFTokenizer(str(tmp_path / "tokenizer.json"))
    assert ours._specials is not None
    text = ("hello world " * 30) + "<sep>" + ("again and again " * 30)
    assert ours.encode(text) == ours._whole(text)
    assert ours._specials is None and not ours._pieces
    assert ours.encode(text) == ours._whole(text)


def test_added_tokens_that_strip_spaces_are_never_cut_at(tmp_path: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["some text " * 20], trainers.BpeTrainer(vocab_size=300))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    assert HFTokenizer(str(tmp_path / "tokenizer.json"))._specials is None
