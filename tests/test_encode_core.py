"""The compiled per-request encode core (`prefixscan/encode/_core.c`) equals the pure-Python reference.

Both paths run on the same adversarial input: ChatML rendering of odd messages, the block chain on any ids,
block size and root, and multi-turn streams (edits, truncations, copies, colliding conversation ids,
special-token strings, unicode, empty text, texts the cut rule splits) through every tokenizer family the
tests build, with normal and tiny cache bounds. Tokens, hashes, head lengths, the work counters and the
caches' contents in LRU order must be the same. A run's tables are the same bytes either way, and a
machine without the extension (or with PREFIXSCAN_PURE=1) runs the pure path.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscan.config import AnalyzeConfig
from prefixscan.encode import core as encode_core
from prefixscan.encode.encoder import RecordEncoder
from prefixscan.encode.hashing import block_hashes
from prefixscan.encode.render import render_chatml
from prefixscan.encode.tokenize.base import SELF_CHECK_FIRST
from prefixscan.pipeline.run import run_analysis
from tests import test_encode_adversarial as adv
from tests import test_tokenize_exact as tx
from tests.conftest import ROOT, compiled

pytestmark = pytest.mark.skipif(encode_core._compiled is None,
                                reason="compiled core not built (pip install -e . builds it)")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def outcome(f: Callable[[], Any]) -> Any:
    """A call's result, or its exception's type and message (both paths must fail alike)."""
    try:
        return f()
    except Exception as exc:  # comparing how the two paths fail
        return ("raised", type(exc).__name__, str(exc))


def both(f: Callable[[], Any]) -> tuple[Any, Any]:
    with compiled(False):
        pure = outcome(f)
    with compiled(True):
        fast = outcome(f)
    return pure, fast


# -- rendering --------------------------------------------------------------------------------------------
text = st.one_of(st.lists(st.sampled_from(tx.ATOMS + adv.WORDS), max_size=12).map("".join), st.text(max_size=20))
role = st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool", "System"]), st.none(),
                 st.integers(0, 3))
content = st.one_of(st.none(), text, st.lists(st.one_of(text, st.fixed_dictionaries({"type": st.just("text"),
                                                                                     "text": text})), max_size=3))
message = st.one_of(
    st.fixed_dictionaries({"role": role, "content": content}),
    st.fixed_dictionaries({}, optional={"role": role, "content": content,
                                        "tool_calls": st.sampled_from([None, [], [{"id": "c1", "x": "é"}]]),
                                        "name": st.sampled_from([None, "", "bob", 0])}),
    st.sampled_from(["not a message", None]),
)


@SETTINGS
@given(st.lists(message, max_size=6), st.sampled_from([None, [], tx.TOOLS, [{"a": 1}, "t"]]))
def test_render_compiled_equals_pure(messages, tools) -> None:
    pure, fast = both(lambda: render_chatml(messages, tools))
    assert pure == fast


# -- the block chain --------------------------------------------------------------------------------------
@SETTINGS
@given(st.lists(st.integers(0, 2**32 - 1), max_size=130), st.integers(1, 40), st.integers(0, 2**64 - 1))
def test_block_chain_compiled_equals_pure(ids, block_size, root) -> None:
    toks = np.array(ids, dtype=np.uint32)
    pure, fast = both(lambda: block_hashes(toks, block_size, root))
    assert pure.dtype == fast.dtype == np.uint64 and fast.flags.writeable
    assert pure.tolist() == fast.tolist()
    assert len(fast) == len(ids) // block_size


# -- whole multi-turn streams, every tokenizer family ------------------------------------------------------
words = st.lists(st.sampled_from(tx.ATOMS + adv.WORDS + ["para one.\n\nPara two,\n\n", "x" * 40 + "\n\n"]),
                 max_size=10).map("".join)
OPS = st.lists(st.tuples(st.sampled_from(["continue", "continue", "continue", "edit", "truncate", "resend",
                                          "copy", "new"]),
                         st.integers(0, 7), words, words), min_size=1, max_size=20)


def _encoder(tok: Any, block_size: int, tiny: bool, hash: str = "xxh3") -> RecordEncoder:
    enc = RecordEncoder(AnalyzeConfig(inputs=("x",), block_size=block_size, hash=hash), keep_tokens=True)
    enc.tokenizer = tok
    tok.checked = SELF_CHECK_FIRST  # the memo itself, not the run-time alarm (it would hide a difference)
    if tiny:
        for lru in (enc.chains._d, tok.seg.memo._memo, tok.seg.pieces, tok.seg.last):
            lru.max_bytes = 1
    return enc


def _state(enc: RecordEncoder) -> Any:
    """What must match after a stream: counters, and the caches' keys in LRU order."""
    seg = enc.tokenizer.seg
    return (enc.stats(), list(seg.memo._memo._d), list(seg.pieces._d), list(seg.last._d), list(enc.chains._d._d),
            sorted(seg.poison), dict(seg.pending))


def _check_family(name: str, tok_dirs: Any, tiny: bool, hash: str = "xxh3") -> None:
    pure_tok, fast_tok = tx.get_tok(name, tok_dirs), tx.get_tok(name, tok_dirs)

    @SETTINGS
    @given(OPS, st.lists(st.integers(0, 20), max_size=4), st.integers(1, 3), st.sampled_from([1, 4, 16]))
    def check(ops, cuts, tools_every, block_size) -> None:
        recs = adv._stream(ops, tools_every)
        pure_enc, fast_enc = _encoder(pure_tok, block_size, tiny, hash), _encoder(fast_tok, block_size, tiny, hash)
        for batch in adv._batches(recs, cuts):
            with compiled(False):
                pure = outcome(lambda b=batch: pure_enc.encode(b))
            with compiled(True):
                fast = outcome(lambda b=batch: fast_enc.encode(b))
            assert type(pure) is type(fast)
            if isinstance(pure, tuple):
                assert pure == fast
                continue
            for p, f in zip(pure, fast, strict=True):
                assert type(p) is type(f)
                if hasattr(p, "reason"):
                    assert (p.reason, p.detail) == (f.reason, f.detail)
                    continue
                assert (p.root, p.n_tokens, p.head_tokens) == (f.root, f.n_tokens, f.head_tokens)
                assert p.tokens.tolist() == f.tokens.tolist() and p.tokens.dtype == f.tokens.dtype
                assert p.hashes.tolist() == f.hashes.tolist() and p.hashes.dtype == f.hashes.dtype
        assert _state(pure_enc) == _state(fast_enc)

    check()
    assert fast_tok.stats.segments_seen > 0


@pytest.mark.parametrize("tiny", [False, True])
@pytest.mark.parametrize("name", list(tx.TIKTOKEN))
def test_stream_compiled_equals_pure_tiktoken(name, tiny) -> None:
    _check_family(name, None, tiny)


@pytest.mark.parametrize("tiny", [False, True])
def test_stream_compiled_equals_pure_vllm_hash(tiny) -> None:
    """vLLM's own block hashes (--hash vllm:sha256): the chain cache resumes through the compiled look-up."""
    _check_family("cl100k", None, tiny, hash="vllm:sha256")


@pytest.mark.parametrize("name", list(tx.HF_FAMILIES))
def test_stream_compiled_equals_pure_hf(name, tok_dirs) -> None:
    _check_family(name, tok_dirs, tiny=name.startswith("metaspace"))


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory):
    pytest.importorskip("transformers")
    return tmp_path_factory.mktemp("zoo")


# -- whole runs ------------------------------------------------------------------------------------------
def test_tables_are_the_same_bytes_compiled_or_pure(tmp_path) -> None:
    for on, name in ((False, "pure"), (True, "compiled")):
        with compiled(on):
            run_analysis(AnalyzeConfig(inputs=(str(ROOT / "sample_logs" / "chat.jsonl"),),
                                       output=str(tmp_path / name), workers=0, quiet=True))
    names = sorted(p.name for p in (tmp_path / "pure").glob("*.parquet"))
    assert names == sorted(p.name for p in (tmp_path / "compiled").glob("*.parquet")) and "requests.parquet" in names
    for n in names:
        assert filecmp.cmp(tmp_path / "pure" / n, tmp_path / "compiled" / n, shallow=False), n


@pytest.mark.parametrize("how", ["env", "missing", "stale"])
def test_pure_path_without_the_extension(how) -> None:
    """PREFIXSCAN_PURE=1, an extension that cannot be imported (not built), or one built from other sources
    (an older calling convention): the pure path, same hashes."""
    block = {"env": "", "missing": "import sys; sys.modules['prefixscan.encode._core'] = None; ",
             "stale": "import sys, types; old = types.ModuleType('prefixscan.encode._core'); old.API = 0; "
                      "sys.modules['prefixscan.encode._core'] = old; "}[how]
    code = (block + "import numpy as np; from prefixscan.encode import core as encode_core; "
            "from prefixscan.encode.hashing import block_hashes; "
            "print(encode_core.core() is None, encode_core.describe(), "
            "block_hashes(np.arange(40, dtype=np.uint32), 16, 7).tolist())")
    env = {"PYTHONPATH": str(ROOT), "PREFIXSCAN_PURE": "1" if how == "env" else "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert out.stdout.startswith("True pure-python"), out.stdout + out.stderr
    with compiled(True):
        want = block_hashes(np.arange(40, dtype=np.uint32), 16, 7).tolist()
    assert out.stdout.rstrip().endswith(str(want))


@SETTINGS
@given(st.lists(st.integers(0, 300), max_size=12), st.lists(st.integers(0, 300), max_size=12), st.integers(0, 12))
def test_assemble_takes_the_base_then_the_new_units(base_sizes, new_sizes, u) -> None:
    """The compiled assemble: the base's first u units' tokens and lens (copied: the base stays as it was),
    then each new unit's memo entry, in order."""
    u = min(u, len(base_sizes))
    rng = np.random.default_rng(len(base_sizes) * 31 + len(new_sizes))
    base = [rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32) for n in base_sizes]
    new = [rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32) for n in new_sizes]
    keys = [bytes([i]) * 16 for i in range(len(new))]
    memo_d = OrderedDict((k, (a, a.nbytes)) for k, a in zip(keys, new, strict=True))
    base_tokens = np.concatenate([*base, np.zeros(0, dtype=np.uint32)])
    base_lens = [len(a) for a in base]
    fast = encode_core._compiled
    assert fast is not None
    blob, lens = fast.assemble([None] * u + [(False, "t")] * len(new), [b"b" * 16] * u + keys, u, memo_d, {},
                               lambda j, done: None, base_tokens if u else None, base_lens if u else None)
    want = np.concatenate([*base[:u], *new, np.zeros(0, dtype=np.uint32)])
    assert np.frombuffer(blob, dtype=np.uint32).tolist() == want.tolist()
    assert lens == base_lens[:u] + [len(a) for a in new]
    lens.append(-1)
    assert base_lens == [len(a) for a in base]  # a copy, not the base's list
    with pytest.raises(ValueError):
        fast.assemble([None] * 2, [b"b" * 16] * 2, 2, memo_d, {}, lambda j, done: None, base_tokens, [1])
