"""Compare prefixscan with what the vLLM engine (and vLLM's own scheduler) reported, request by request.

Runs in the project's venv (prefixscan installed), reading the workload and the engine's JSONL results:
- prompt tokens: prefixscan's tokenizer (`hf:DIR`, the path `analyze` takes, memo included) against the
  engine's prompt ids (length and digest); the direct path (`encode_direct`) is checked too, to name causes;
- cached tokens: unbounded runs against the requests table's `cached_tokens`; bounded runs against a
  one-replica `simulate` with `kv_blocks` = the engine's pool (per request) and the capacity curve's LRU hit
  at pool x block size tokens (total), whatever pool model prefixscan has when this runs;
- block hashes: against the requests table's `block_hashes` with `--hash vllm:ALGO --hash-seed SEED`, or
  "not available" when this prefixscan has no such option.

Usage: python conformance/compare.py OUT_ROOT [--families bpe,deepseek,mistral] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import prefixscan
from prefixscan.config import AnalyzeConfig
from prefixscan.encode.tokenize import load_tokenizer
from prefixscan.read.shapes import normalise


def digest(ids: Any) -> str:
    return hashlib.sha256(np.asarray(ids, dtype="<u4").tobytes()).hexdigest()[:16]


def read_results(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return lines[0], lines[1:]


class Tokens:
    """prefixscan's prompt ids per record: as `analyze` gets them (memo with its run-time check and
    fallback), the direct path, and the memo forced on (check switched off) to show what the check saved."""

    def __init__(self, workload: Path, tokenizer: str) -> None:
        from prefixscan.encode.tokenize.base import SELF_CHECK_FIRST

        objs = [json.loads(x) for x in workload.read_text(encoding="utf-8").splitlines() if x.strip()]
        recs = [normalise(o, "chat", str(workload), i + 1, {}) for i, o in enumerate(objs)]
        tok = load_tokenizer(tokenizer)
        memo = tok.encode_batch(recs)
        self.digests = [digest(e.tokens) for e in memo]
        self.lengths = [len(e.tokens) for e in memo]
        self.fallback = tok.stats.fallback_reason
        self.direct = [digest(tok.encode_direct(r)) for r in recs]
        forced = load_tokenizer(tokenizer)
        forced.checked = SELF_CHECK_FIRST  # no run-time comparison, hence no fallback
        self.forced = [digest(e.tokens) for e in forced.encode_batch(recs)]


def has_vllm_hash() -> bool:
    return "hash" in {f.name for f in dataclasses.fields(AnalyzeConfig)}


class Prefixscan:
    """prefixscan's figures for one family's workload, computed once per block size / pool."""

    def __init__(self, workload: Path, tokenizer: str, tmp: Path) -> None:
        self.workload, self.tokenizer, self.tmp = workload, tokenizer, tmp
        self.tokens = Tokens(workload, tokenizer)
        self._runs: dict[tuple[int, str | None], Any] = {}
        self.pools: dict[int, set[int]] = {}  # bounded pools per block size: one capacity curve covers all

    def run(self, block_size: int, hash_algo: str | None = None, seed: str | None = None) -> Any:
        key = (block_size, hash_algo)
        if key not in self._runs:
            opts: dict[str, Any] = {"tokenizer": self.tokenizer, "block_size": block_size, "findings": False}
            if block_size == 1:  # SGLang's page size 1: prefixscan's token granularity
                opts |= {"granularity": "token", "block_size": 16}
            if self.pools.get(block_size) and not hash_algo:
                opts["capacities"] = tuple(sorted(p * block_size for p in self.pools[block_size]))
            if hash_algo:
                opts |= {"hash": f"vllm:{hash_algo}", "hash_seed": seed}
            out = self.tmp / f"run-b{block_size}-{hash_algo or 'xxh3'}"
            res = prefixscan.analyze(str(self.workload), output=str(out), force=True, **opts)
            self._runs[key] = (res, out)
        return self._runs[key]

    def bounded(self, block_size: int, pool: int) -> tuple[list[int], int]:
        """(per-request cached tokens of a one-replica simulation, capacity-curve LRU hit tokens) at a pool."""
        res, out = self.run(block_size)
        sim = prefixscan.simulate(str(out), save=False, replicas=1, policies=("round_robin",), kv_blocks=pool)
        dec = sim.tables["sim_decisions"] if hasattr(sim, "tables") else None
        per_req = [int(x) for x in dec["actual_cached_tokens"].to_pylist()] if dec is not None else []
        curve = res.tables["capacity_curve"].to_pylist()
        lru = next(int(r["lru_hit_tokens"]) for r in curve if r["capacity_tokens"] == pool * block_size)
        return per_req, lru


def compare_file(ps: Prefixscan, path: Path) -> dict[str, Any]:
    """One results file against prefixscan: counts and every differing request with its cause."""
    head, rows = read_results(path)
    bs, pool, bounded = head["block_size"], head["pool_blocks"], head["bounded"]
    tk = ps.tokens
    memo, direct, lengths = tk.digests, tk.direct, tk.lengths
    res, _ = ps.run(bs)
    req = res.tables["requests"].to_pylist()
    tok_eq = [memo[i] == r["digest"] for i, r in enumerate(rows)]
    diffs: list[dict[str, Any]] = []
    for i, r in enumerate(rows):
        if not tok_eq[i]:
            cause = ("prefixscan's segment memo (the direct path agrees with vLLM)" if direct[i] == r["digest"]
                     else "rendering or tokenizer differs (the direct path differs too)")
            diffs.append({"request": r["request_id"], "what": "prompt tokens", "engine": r["prompt_tokens"],
                          "prefixscan": lengths[i], "cause": cause})
    if bounded:
        sim_cached, lru_total = ps.bounded(bs, pool)
        ps_cached = sim_cached or [None] * len(rows)
    else:
        ps_cached, lru_total = [int(x["cached_tokens"]) for x in req], None
    cached_eq = [ps_cached[i] == r["cached_tokens"] for i, r in enumerate(rows)]
    for i, r in enumerate(rows):
        if not cached_eq[i]:
            cause = ("prompt tokens differ" if not tok_eq[i] else
                     "pool model (one-replica simulate) differs from vLLM's block pool" if bounded
                     else "hit model differs")
            diffs.append({"request": r["request_id"], "what": "cached tokens", "engine": r["cached_tokens"],
                          "prefixscan": ps_cached[i], "cause": cause})
    hashes = compare_hashes(ps, head, rows, tok_eq, diffs)
    return {"file": path.name, "kind": head["kind"], "block_size": bs, "pool_blocks": pool, "bounded": bounded,
            "requests": len(rows), "prompt_tokens_equal": sum(tok_eq), "cached_tokens_equal": sum(cached_eq),
            "hashes_equal": hashes, "engine_cached_total": sum(r["cached_tokens"] for r in rows),
            "prefixscan_cached_total": sum(x for x in ps_cached if x is not None),
            "capacity_curve_lru_total": lru_total, "tokenizer_fallback": tk.fallback,
            "memo_forced_equal": sum(tk.forced[i] == r["digest"] for i, r in enumerate(rows)), "diffs": diffs}


def compare_hashes(ps: Prefixscan, head: dict[str, Any], rows: list[dict[str, Any]], tok_eq: list[bool],
                   diffs: list[dict[str, Any]]) -> int | str:
    """Requests whose full-block hashes equal the engine's, or why that cannot be checked."""
    if head["hash_algo"] is None:
        return "n/a (SGLang's radix tree keys on tokens, not block hashes)"
    if not has_vllm_hash():
        return "not available (this prefixscan has no --hash vllm:ALGO)"
    try:
        res, _ = ps.run(head["block_size"], head["hash_algo"], head["pythonhashseed"])
    except Exception as e:  # an option that exists but refuses this run is a finding
        return f"not available ({type(e).__name__}: {e})"
    ours = [[f"{h:016x}" for h in x] for x in res.tables["requests"]["block_hashes"].to_pylist()]
    eq = 0
    for i, r in enumerate(rows):
        if ours[i] == r["block_hashes"]:
            eq += 1
        else:
            cause = "prompt tokens differ" if not tok_eq[i] else "hash values differ"
            diffs.append({"request": r["request_id"], "what": "block hashes", "engine": len(r["block_hashes"]),
                          "prefixscan": len(ours[i]), "cause": cause})
    return eq


def family_results(root: Path, fam: str) -> list[dict[str, Any]]:
    tokdir = root / "models" / fam
    with tempfile.TemporaryDirectory(prefix=f"conformance-{fam}-") as tmp:
        ps = Prefixscan(root / fam / "workload.jsonl", f"hf:{tokdir}", Path(tmp))
        files = sorted((root / fam / "results").glob("*.jsonl"), key=_order)
        for f in files:
            head, _ = read_results(f)
            if head["bounded"]:
                ps.pools.setdefault(head["block_size"], set()).add(head["pool_blocks"])
        return [{"family": fam} | compare_file(ps, f) for f in files]


def _order(p: Path) -> tuple[int, int, int]:
    kind, b, pool = p.stem.split("-")
    return ("engine", "driver", "sglang").index(kind), -int(b[1:]), int(pool[1:])


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the docs."""
    out = ["| family | run | block | pool (blocks) | requests | prompt tokens equal | cached tokens equal | "
           "hashes equal | cached total engine / prefixscan (LRU curve) |", "|" + " --- |" * 9]
    for r in rows:
        pool = f"{r['pool_blocks']:,}" if r["bounded"] else "unbounded"
        tot = f"{r['engine_cached_total']:,} / {r['prefixscan_cached_total']:,}"
        if r["capacity_curve_lru_total"] is not None:
            tot += f" ({r['capacity_curve_lru_total']:,})"
        h = r["hashes_equal"] if isinstance(r["hashes_equal"], int) else "n/a"
        out.append(f"| {r['family']} | {r['kind']} | {r['block_size']} | {pool} | {r['requests']} | "
                   f"{r['prompt_tokens_equal']} | {r['cached_tokens_equal']} | {h} | {tot} |")
    return "\n".join(out)


def tokenizer_table(rows: list[dict[str, Any]]) -> str:
    """Per family: which path prefixscan's tokenizer took, and how the memo alone would have fared."""
    out = ["| family | requests | prompt ids equal to vLLM (as analyze runs) | tokenizer path | memo forced on, "
           "check off: equal |", "|" + " --- |" * 5]
    seen = set()
    for r in rows:
        if r["family"] in seen:
            continue
        seen.add(r["family"])
        path = f"fallback: {r['tokenizer_fallback']}" if r["tokenizer_fallback"] else "segment memo (no fallback)"
        out.append(f"| {r['family']} | {r['requests']} | {r['prompt_tokens_equal']} | {path} | "
                   f"{r['memo_forced_equal']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--families", default="bpe,deepseek,mistral")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    root = Path(a.root)
    rows = [r for fam in a.families.split(",") if (root / fam / "results").exists()
            for r in family_results(root, fam)]
    print(table(rows))
    bad = [r for r in rows if r["prompt_tokens_equal"] < r["requests"] or r["cached_tokens_equal"] < r["requests"]]
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
