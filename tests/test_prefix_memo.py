"""The conversation-prefix memo (`tokenize.prefix`) against the direct path, on adversarial traffic.

A stream of requests is built from a few conversations by continuing, editing, truncating, resending
and copying them (the same text in another conversation and namespace), with special-token strings,
empty messages and tools, and cut into batches at random places (prompts that continue one planned
earlier in the same batch). Every request's tokens must equal `encode_direct`, its head length the
one a fresh tokenizer gives, and its block hashes `block_hashes` of the direct tokens, under tiny memo
bounds too (everything evicted all the time).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscan.config import AnalyzeConfig
from prefixscan.hashing import BytesLRU, block_hashes
from prefixscan.io.shapes import Record
from prefixscan.pipeline.encoder import Hashed, RecordEncoder, root_of
from prefixscan.tokenize import prefix as prefix_mod
from prefixscan.tokenize.base import SELF_CHECK_FIRST
from tests import test_tokenize_exact as tx

WORDS = ["hello", " world", "\n\n", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "", "x" * 30, "é", "😀",
         "Rules_\n\n", "\n", " ", "<s>", "[CLS]", "\n\n/", "end."]
text = st.lists(st.sampled_from(WORDS), max_size=8).map("".join)
OPS = st.lists(st.tuples(st.sampled_from(["continue", "continue", "continue", "edit", "truncate", "resend",
                                          "copy", "new"]),
                         st.integers(0, 7), text, text), min_size=1, max_size=24)
SYSTEMS = ["You are terse.", "Rules:\n\nbe exact.\n\nEnd.", "", "<|im_end|> in a system prompt"]
MODELS = ["m1", "m2"]


def _stream(ops, tools_every: int) -> list[Record]:
    """Requests in log order from the ops: each op touches conversation `c % len(convs)`."""
    convs: list[dict] = []
    out = []
    for op, c, t1, t2 in ops:
        if op == "new" or not convs:
            convs.append({"msgs": [("system", SYSTEMS[c % len(SYSTEMS)])] if c % 2 else [],
                          "model": MODELS[c % 2], "tools": tx.TOOLS if c % tools_every == 0 else None})
            convs[-1]["msgs"].append(("user", t1))
        conv = convs[c % len(convs)]
        msgs = conv["msgs"]
        if op == "continue":
            msgs += [("assistant", t1), ("user", t2)]
        elif op == "edit" and msgs:
            i = c % len(msgs)
            msgs[i] = (msgs[i][0], msgs[i][1] + t1)
        elif op == "truncate" and len(msgs) > 1:
            del msgs[-(1 + c % (len(msgs) - 1)):]
        elif op == "copy":  # the same text in another conversation, and another namespace
            convs.append({"msgs": list(msgs), "model": MODELS[(c + 1) % 2], "tools": conv["tools"]})
        i = len(out)
        r = tx.rec(list(msgs), i, conv["tools"])
        r.model = conv["model"]
        out.append(r)
    return out


def _batches(recs: list[Record], cuts: list[int]) -> list[list[Record]]:
    out, start = [], 0
    for c in sorted(set(cuts)):
        if start < c < len(recs):
            out.append(recs[start:c])
            start = c
    return [*out, recs[start:]]


def _encoder(tok, tiny: bool) -> RecordEncoder:
    enc = RecordEncoder(AnalyzeConfig(inputs=("x",), block_size=4), keep_tokens=True)
    enc.tokenizer = tok
    if tiny:
        for lru in (enc.chains._d, tok.seg.memo._memo, tok.seg.pieces, tok.seg.prefixes._lru):
            lru.max_bytes = 1
    return enc


def _check_stream(tok, fresh, recs: list[Record], cuts: list[int], tiny: bool) -> None:
    enc = _encoder(tok, tiny)
    tok.checked = SELF_CHECK_FIRST  # the memo itself, not the run-time alarm
    for batch in _batches(recs, cuts):
        for r, e in zip(batch, enc.encode(batch), strict=True):
            direct = tok.encode_direct(r)
            if not len(direct):
                continue
            assert isinstance(e, Hashed)
            assert e.tokens.tolist() == direct.tolist(), r.messages
            root = root_of(enc.cfg, r, tok.id, tok.template_version)
            assert e.hashes.tolist() == block_hashes(direct, 4, root).tolist()
            fresh.checked = SELF_CHECK_FIRST
            assert e.head_tokens == fresh.encode_batch([r])[0].head_tokens


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@pytest.mark.parametrize("tiny", [False, True])
@pytest.mark.parametrize("name", ["cl100k", "r50k"])
def test_prefix_memo_equals_direct_tiktoken(name, tiny) -> None:
    tok, fresh = tx.tiktoken_with(tx.TIKTOKEN[name]), tx.tiktoken_with(tx.TIKTOKEN[name])

    @SETTINGS
    @given(OPS, st.lists(st.integers(0, 24), max_size=4), st.integers(1, 3))
    def check(ops, cuts, tools_every) -> None:
        _check_stream(tok, fresh, _stream(ops, tools_every), cuts, tiny)

    check()
    assert tok.stats.prefix_hits > 0


@pytest.mark.parametrize("tiny", [False, True])
@pytest.mark.parametrize("name", ["bytelevel-qwen2-nfc", "metaspace-first", "metaspace-text-first"])
def test_prefix_memo_equals_direct_hf(name, tiny, tok_dirs) -> None:
    tok, fresh = tx.get_tok(name, tok_dirs), tx.get_tok(name, tok_dirs)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(OPS, st.lists(st.integers(0, 24), max_size=4), st.integers(1, 3))
    def check(ops, cuts, tools_every) -> None:
        fresh.head_memo = {}
        _check_stream(tok, fresh, _stream(ops, tools_every), cuts, tiny)

    check()
    assert tok.stats.prefix_hits > 0


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory):
    pytest.importorskip("transformers")
    return tmp_path_factory.mktemp("zoo")


def test_prefix_is_taken_whole_and_only_new_pieces_are_planned() -> None:
    """The point of the memo: a continuing turn plans only its new messages and the generation prompt,
    and hashes only the blocks after the previous turn's history."""
    tok = tx.tiktoken_with(None)
    enc = _encoder(tok, tiny=False)
    hist = [("system", "S. " * 400), ("user", "first question " * 50)]
    enc.encode([tx.rec(hist, 0)])
    seen, hashed = tok.stats.segments_seen, enc.chains.blocks_hashed
    hist += [("assistant", "an answer " * 30), ("user", "next")]
    (e,) = enc.encode([tx.rec(hist, 1)])
    assert tok.stats.prefix_hits == 1
    assert tok.stats.segments_seen - seen == 5  # two bodies, two "\n", "assistant\n"
    assert enc.chains.blocks_hashed - hashed < len(e.tokens) // 4 // 4  # the history's blocks were resumed
    assert enc.chains.blocks_reused > 0
    assert e.tokens.tolist() == tok.encode_direct(tx.rec(hist, 1)).tolist()


def test_edited_history_is_not_taken() -> None:
    tok = tx.tiktoken_with(None)
    tok.checked = SELF_CHECK_FIRST
    a = [("user", "hello there")]
    tok.encode_batch([tx.rec(a, 0)])
    b = [("user", "hello therE"), ("assistant", "hi"), ("user", "ok")]
    (e,) = tok.encode_batch([tx.rec(b, 1)])
    assert e.base is None and tok.stats.prefix_hits == 0
    assert e.tokens.tolist() == tok.encode_direct(tx.rec(b, 1)).tolist()


def test_memo_is_bounded() -> None:
    memo = prefix_mod.PrefixMemo(max_bytes=5000)
    toks = np.zeros(100, dtype=np.uint32)
    for i in range(50):
        p = prefix_mod.Prefix(b"\x00", ("x" * 100,), toks, (b"k" * 16,), (100,), (1,), 600)
        memo.remember(i, p, None)
    assert memo._lru.bytes <= 5000 and len(memo._lru) < 50
    assert isinstance(memo._lru, BytesLRU)
