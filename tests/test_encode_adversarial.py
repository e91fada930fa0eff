"""The encode stage's fast path (segment memo, piece cache, conversation cache, chain checkpoints)
against the direct path on adversarial multi-turn traffic.

A stream of requests is built from a few conversations by continuing, editing, truncating, resending
and copying them (the same text in another conversation and namespace), with special-token strings,
empty messages and tools, and cut into batches at random places. Conversation ids are absent or
deliberately shared by different conversations (the conversation cache must check what it resumes).
Every request's tokens must equal `encode_direct`, its head length the one a fresh tokenizer gives,
and its block hashes `block_hashes` of the direct tokens, under tiny cache bounds too (everything
evicted all the time).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.encoder import Hashed, RecordEncoder, root_of
from prefixscan.encode.hashing import block_hashes
from prefixscan.encode.tokenize.base import SELF_CHECK_FIRST
from prefixscan.read.record import Record
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
        k = next(j for j, x in enumerate(convs) if x is conv)
        r.conversation_id = f"shared-{k % 2}" if k % 3 else None  # ids that collide, or none
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
        for lru in (enc.chains._d, tok.seg.memo._memo, tok.seg.pieces, tok.seg.last):
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
def test_fast_path_equals_direct_tiktoken(name, tiny) -> None:
    tok, fresh = tx.tiktoken_with(tx.TIKTOKEN[name]), tx.tiktoken_with(tx.TIKTOKEN[name])

    @SETTINGS
    @given(OPS, st.lists(st.integers(0, 24), max_size=4), st.integers(1, 3))
    def check(ops, cuts, tools_every) -> None:
        _check_stream(tok, fresh, _stream(ops, tools_every), cuts, tiny)

    check()
    assert tok.stats.segments_seen > tok.stats.segments_tokenised  # the memo was used
    assert tiny or tok.stats.units_resumed > 0  # turns were taken from their conversation's last prompt


@pytest.mark.parametrize("tiny", [False, True])
@pytest.mark.parametrize("name", ["bytelevel-qwen2-nfc", "metaspace-first", "metaspace-text-first"])
def test_fast_path_equals_direct_hf(name, tiny, tok_dirs) -> None:
    tok, fresh = tx.get_tok(name, tok_dirs), tx.get_tok(name, tok_dirs)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(OPS, st.lists(st.integers(0, 24), max_size=4), st.integers(1, 3))
    def check(ops, cuts, tools_every) -> None:
        fresh.head_memo = {}
        _check_stream(tok, fresh, _stream(ops, tools_every), cuts, tiny)

    check()
    assert tok.stats.segments_seen > tok.stats.segments_tokenised  # the memo was used
    assert tiny or tok.stats.units_resumed > 0


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory):
    pytest.importorskip("transformers")
    return tmp_path_factory.mktemp("zoo")
