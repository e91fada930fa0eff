"""The ingest-time caches (token memo, piece cache, conversation cache, detector memo, chain prefixes) are
bounded by bytes; results must never depend on those bounds, only speed does."""

from __future__ import annotations

import numpy as np
import pytest

import prefixscan
import prefixscan.detect.detector as detector_mod
import prefixscan.encode.hashing as hashing
import prefixscan.encode.tokenize.base as tok_base
from prefixscan.encode.hashing import BytesLRU, ChainCache, block_hashes
from prefixscan.synth import REGISTRY, SynthConfig, write


def test_bytes_lru_evicts_least_recently_used() -> None:
    lru = BytesLRU(10)
    lru.put("a", 1, 4)
    lru.put("b", 2, 4)
    assert lru.get("a") == 1  # "b" is now the oldest
    lru.put("c", 3, 4)
    assert lru.get("b") is None and lru.get("a") == 1 and lru.get("c") == 3
    assert lru.bytes == 8 and lru.evicted == 1


@pytest.mark.parametrize("max_bytes", [1, 1 << 30])
def test_chain_cache_equals_block_hashes_at_any_bound(max_bytes: int) -> None:
    rng = np.random.default_rng(3)
    head = [rng.integers(0, 5000, 40).astype(np.uint32)]
    cache = ChainCache(max_bytes=max_bytes)
    turns = head
    for t in range(6):  # a conversation: every turn resends the previous ones and adds two pieces
        turns = [*turns, rng.integers(0, 5000, 23 + t).astype(np.uint32), rng.integers(0, 5000, 7).astype(np.uint32)]
        toks = np.concatenate(turns)
        keys = [p.tobytes()[:16].ljust(16, b"\0") + bytes([i]) for i, p in enumerate(turns)]
        lens = [len(p) for p in turns]
        got = cache.hashes(toks, 16, 99, keys, lens, [0, len(turns) - 2])
        assert got.tolist() == block_hashes(toks, 16, 99).tolist()
        segs = cache.segments(toks, 16, 99, keys, lens, [0, len(turns) - 2])
        assert np.concatenate(segs).tolist() == got.tolist()
    if max_bytes > 1:
        assert cache.blocks_reused > 0


def _tables(log: str) -> tuple[dict, dict]:
    r = prefixscan.analyze(log)
    summary = {k: v for k, v in r.summary.items() if k != "timings"}
    summary["input"] = {k: v for k, v in summary["input"].items() if k != "tokenizer_stats"}  # work counters
    return dict(r.tables), summary


def test_tiny_cache_bounds_give_identical_results(tmp_path, monkeypatch) -> None:
    log = tmp_path / "chat.jsonl"
    write(SynthConfig(requests=600, seed=11, tenants=3, prompt_tokens=900, scenarios=(("chat", 1.0),),
                      breakers=tuple(REGISTRY), breaker_rate=0.4), str(log))
    tables, summary = _tables(str(log))
    monkeypatch.setattr(tok_base, "PIECE_CACHE_BYTES", 1)
    monkeypatch.setattr(tok_base, "MEMO_BYTES", 1)
    monkeypatch.setattr(tok_base, "LAST_BYTES", 1)
    monkeypatch.setattr(detector_mod, "MEMO_BYTES", 1)
    monkeypatch.setattr(hashing, "CHAIN_CACHE_BYTES", 1)
    tiny_tables, tiny_summary = _tables(str(log))
    assert summary["findings"], "the log should have findings, so the detector's caches are exercised"
    assert tiny_summary == summary
    assert tables.keys() == tiny_tables.keys()
    for name, t in tables.items():
        assert t.equals(tiny_tables[name]), name


def test_detector_keeps_one_operation_set_per_distinct_rewrite(tmp_path) -> None:
    """Per rewritten request the detector keeps an index into shared operation sets (not its own lists),
    and finding keys once by number; the per-request rewrite still reads back whole."""
    from prefixscan.config import AnalyzeConfig
    from prefixscan.pipeline.encode import ingest

    log = tmp_path / "chat.jsonl"
    write(SynthConfig(requests=400, seed=5, tenants=2, prompt_tokens=700, scenarios=(("chat", 1.0),),
                      breakers=tuple(REGISTRY), breaker_rate=0.5), str(log))
    det = ingest(AnalyzeConfig(inputs=(str(log),))).detector
    assert det.ops_of and len(det.opsets) < len(det.ops_of)
    keys = det.opset_keys()
    for sid in set(det.ops_of.values()):
        ops, kids = det.opsets[sid]
        assert len(ops) == len(kids) and keys[sid] == list(dict.fromkeys(det.keys[i] for i in kids))
        assert det.kept_ops(sid, set(det.keys)) == list(ops)


def test_chain_prefix_keys_follow_key_boundaries() -> None:
    """Two key lists with the same bytes joined but other boundaries name different prefixes (a resumed
    chain must be the same segments, not the same bytes)."""
    a = hashing._PrefixKeys(7, [b"a" * 15, b"b" * 17])
    b = hashing._PrefixKeys(7, [b"a" * 15 + b"b", b"b" * 16])
    assert a(0) != b(0) and a(1) != b(1)
    same = hashing._PrefixKeys(7, [b"k" * 16, b"l" * 16])
    assert same(1) == hashing._PrefixKeys(7, [b"k" * 16, b"l" * 16, b"m" * 16])(1)  # a prefix's key
    assert same(1) != hashing._PrefixKeys(8, [b"k" * 16, b"l" * 16])(1)  # another root
