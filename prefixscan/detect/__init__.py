"""Cache-breaker findings: dynamic fields, pattern-free spans, normalisation drift.

The engine's shortfall against the prediction is not a breaker: `attribution` splits it into routing,
eviction and unexplained (a tokenizer or template mismatch).

`Detector` is fed by ingest; `finalize` runs after the reuse analysis and returns a FindingsResult
(findings ranked by tokens lost, the counterfactual hit rate, and the tables for the run directory).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from prefixscan.detect.accumulate import Acc, merge_aliases, token_offset
from prefixscan.detect.counterfactual import Blocks, Counterfactual, run_counterfactual
from prefixscan.detect.detector import Detector
from prefixscan.detect.findings import Finding, finding_requests_table, findings_table, fix_sentence, rank

MIN_REQUESTS = 2
MAX_CHURN_VERSIONS = 8

__all__ = ["Detector", "Finding", "FindingsResult", "finalize"]


@dataclass
class FindingsResult:
    """Ranked findings, the counterfactual, and per-request rewrite operations (for `fix`)."""

    findings: list[Finding]
    counterfactual: Counterfactual
    ops: dict[str, list[tuple]] = field(default_factory=dict)
    seconds: float = 0.0

    def tables(self) -> dict[str, pa.Table]:
        return {"findings": findings_table(self.findings), "finding_requests": finding_requests_table(self.findings)}

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.findings]


def _kind(acc: Acc) -> str | None:
    if acc.key[0] in ("drift", "order"):
        return acc.key[2]
    votes = {k: v for k, v in acc.kinds.items() if k}
    if acc.prose and acc.prose * 2 >= sum(acc.kinds.values()):
        return "template_churn" if len(acc.values) <= MAX_CHURN_VERSIONS else "pattern_free"
    if not votes:
        return "pattern_free"
    kind = max(sorted(votes), key=lambda k: votes[k])
    if kind == "random_token" and acc.ints >= 3 and acc.increases >= 0.8 * (acc.ints - 1):
        return "counter"
    return kind


def _candidate(acc: Acc) -> bool:
    if acc.key[0] == "span":
        return len(acc.requests) >= MIN_REQUESTS and len(acc.values) >= 2
    return len(acc.requests) >= 1


def finalize(det: Detector | None, req: pl.DataFrame, blocks: Blocks, block_size: int,
             rule: str, hash_tenants: Callable[[str], str | None] | None = None,
             baseline: np.ndarray | None = None) -> FindingsResult:
    """Findings for a finished analysis: counterfactual re-analysis, credit, thresholds, ranking.
    `hash_tenants`: the run's keyed tenant hash (`privacy.tenant_hasher`), None to keep names."""
    t0 = time.perf_counter()
    findings: list[Finding] = []
    cf = Counterfactual()
    ops: dict[str, list[tuple]] = {}
    if det is not None and det.fed:
        det.retro_exemplars()
        det.retro_lists()
        det.flush(det.tokenizer)
        alias = merge_aliases(det.accs)
        if alias:
            det.alias_keys(alias)
        set_keys = det.opset_keys()
        for rid, sid in det.ops_of.items():  # normalisers were applied before their drift was first seen
            for k in set_keys[sid]:
                if k[0] == "drift" and k in det.accs:
                    det.accs[k].add_request(rid)
        cands = {k: a for k, a in det.accs.items() if _candidate(a)}
        set_cands = [[k for k in ks if k in cands] for ks in set_keys]
        keys = {rid: set_cands[sid] for rid, sid in det.ops_of.items() if set_cands[sid]}
        rewritten = {rid: det.rewritten[rid] for rid in keys if rid in det.rewritten}
        cf = run_counterfactual(req, blocks, block_size, rule, rewritten, keys, baseline)
        for key in sorted(cands, key=repr):
            acc = cands[key]
            credit = cf.credit.get(key, {})
            lost = sum(credit.values())
            if lost < block_size:
                continue
            kind = _kind(acc) or "pattern_free"
            detail = None
            if acc.detail == "inline" and kind in ("timestamp", "date"):
                detail = "written inside a sentence: no safe automatic rewrite"
            if kind == "list_order":
                detail = acc.detail
            if kind == "template_churn":
                counts = sorted(acc.values.values(), reverse=True)
                detail = f"{len(counts)} versions serve {'/'.join(map(str, counts))} requests"
            tenant = (hash_tenants(acc.tenant) if hash_tenants is not None else acc.tenant) if acc.tenant else None
            offset = acc.char_offset
            acc.token_offset = token_offset(det.tokenizer, acc)
            findings.append(Finding(
                kind=kind, tenant=tenant, family=acc.family or None, label=acc.label or None,
                message_index=acc.mi, role=acc.role, char_offset=offset, token_offset=acc.token_offset,
                block_index=acc.token_offset // block_size if acc.token_offset is not None else None,
                requests_affected=len(acc.requests), distinct_values=len(acc.values) if key[0] == "span" else None,
                tokens_lost=int(lost), example=acc.example, example_request_id=acc.example_request_id,
                detail=detail, fix=fix_sentence(kind, acc.label or None, acc.role, detail, acc.mi, offset),
                request_ids=list(acc.requests), request_gains=[int(credit.get(r, 0)) for r in acc.requests],
            ))
        kept = {k for k in cands if sum(cf.credit.get(k, {}).values()) >= block_size}
        shared: dict[int, list[tuple]] = {}  # one list per operation set (`fix` only reads them)
        for rid, sid in det.ops_of.items():
            if any(k in kept for k in set_keys[sid]):
                if sid not in shared:
                    shared[sid] = det.kept_ops(sid, kept)
                ops[rid] = shared[sid]
        if det.errors:
            cf.detector_errors = det.errors
    findings = rank(findings)
    return FindingsResult(findings, cf, ops, (det.seconds if det else 0.0) + time.perf_counter() - t0)
