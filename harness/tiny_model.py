"""Makes the engine tier's tiny model in a folder vLLM serves with no hub:
a 2-layer Llama (hidden 128, 4 heads, vocab 4,096) with seeded random
weights, a byte-level BPE tokenizer trained on the machine's license texts
in a fixed order, and a ChatML chat template. Run by the engine venv's
python (it needs torch): ``python harness/tiny_model.py OUT``. Output is
gibberish; requests use ``ignore_eos`` for fixed lengths.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, set_seed

SEED = 0
VOCAB = 4096
CORPUS = Path("/usr/share/common-licenses")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as the router renders it with jinja2 and vLLM with transformers
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def corpus() -> list[str]:
    """The license texts, sorted by name so training sees one order."""
    files = sorted(p for p in CORPUS.rglob("*") if p.is_file() and not p.is_symlink())
    if not files:
        raise SystemExit(f"no training text under {CORPUS}")
    return [p.read_text(errors="replace") for p in files]


def tokenizer(out: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")
    return tok


def main(out: Path) -> None:
    out.mkdir(parents=True)
    tok = tokenizer(out)
    set_seed(SEED)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=2048, tie_word_embeddings=False,
        bos_token_id=tok.token_to_id("<|endoftext|>"), eos_token_id=tok.token_to_id("<|im_end|>"),
        pad_token_id=tok.token_to_id("<|endoftext|>"))
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: tiny_model.py OUT")
    main(Path(sys.argv[1]))
