"""Every miss attributed: why a request's prefill was not served from cache, in tokens.

For each request, four hit counts nest (block-granular, under the run's hit rule):

    counterfactual C  (ideal cache, breakers fixed)   >=  ideal I (ideal cache, the log as sent)
                      >=  same-replica ideal R (an ideal cache per replica)  >=  engine-reported actual A

so the tokens the fixed, ideal cache would have hit split exactly into
    breaker     = C - I   the prompt breakers (findings; the one with the largest share is named)
    routing     = I - R   the request went to a replica that had not seen the prefix
    eviction    = R - A   the replica had seen it but the engine no longer had it
    unexplained            the part of R - A that eviction cannot explain: the previous request on the
                           same replica had just computed those blocks (nothing came between them), or the
                           model's engine values regularly exceed R (its tokenizer or chat template differ
                           from the analysis': the engine sees other tokens than prefixscan does), or
                           the log's own prompt token counts disagree with prefixscan's.
Only `breaker` is a cache breaker. Without a replica field, routing and eviction cannot be told from a
mismatch: R is taken as I and the whole I - A gap is `unexplained`. A replica field with a single value
counts as absent. When A > R the excess is reported,
not subtracted (`engine_excess_tokens`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan.reuse.ideal import IdealStream, hit_tokens_array, scope_salts

MISMATCH_SHARE = 0.1  # a model whose engine values exceed R this often has a tokenizer/template mismatch

MISSES_SCHEMA = pa.schema([
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("request_id", pa.string(), nullable=False),
    pa.field("replica", pa.string()),
    pa.field("prompt_tokens", pa.int64(), nullable=False),
    pa.field("counterfactual_cached_tokens", pa.int64(), nullable=False),
    pa.field("ideal_cached_tokens", pa.int64(), nullable=False),
    pa.field("replica_cached_tokens", pa.int64()),
    pa.field("actual_cached_tokens", pa.int64()),
    pa.field("lost_breaker_tokens", pa.int64(), nullable=False),
    pa.field("breaker_rank", pa.int64()),
    pa.field("lost_routing_tokens", pa.int64()),
    pa.field("lost_eviction_tokens", pa.int64()),
    pa.field("lost_unexplained_tokens", pa.int64()),
    pa.field("engine_excess_tokens", pa.int64()),
])

Chunks = Iterable[tuple[np.ndarray, np.ndarray]]  # (local CSR offsets, block hashes), in row order


@dataclass
class Attribution:
    """The `misses` table and its totals (the summary's `miss_attribution`)."""

    table: pa.Table
    summary: dict[str, Any] = field(default_factory=dict)


def breaker_credit(findings: list[Any], request_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens a request gains once every finding is fixed, rank of the finding with the largest gain or
    -1) per request, from the findings' per-request gains."""
    at = {r: i for i, r in enumerate(request_ids)}
    gain = np.zeros(len(request_ids), np.int64)
    best = np.zeros(len(request_ids), np.int64)
    rank = np.full(len(request_ids), -1, np.int64)
    for f in findings:
        for rid, g in zip(f.request_ids, f.request_gains or [0] * len(f.request_ids), strict=True):
            i = at.get(rid)
            if i is None:
                continue
            gain[i] += g
            if g > best[i]:
                best[i], rank[i] = g, f.rank
    return np.maximum(gain, 0), rank


def _lcp_blocks(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    neq = np.nonzero(a[:n] != b[:n])[0]
    return int(neq[0]) if len(neq) else n


def replica_pass(req: pl.DataFrame, chunks: Chunks, block_size: int, rule: str
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ideal I, same-replica ideal R, hit on the previous request of the same replica P) per request.

    One ideal pass with the replica as the scope (the scope salt), plus, per request, the common block
    prefix with the last request the same replica served (kept per replica: a handful of arrays)."""
    n = req.height
    prompt = req["prompt_tokens"].to_numpy().astype(np.int64)
    reps = req["replica"].to_list()
    salts = scope_salts(reps)
    ideal, same, prev_hit = (np.zeros(n, np.int64) for _ in range(3))
    stream = IdealStream()
    last: dict[str | None, np.ndarray] = {}
    at = 0
    for offsets, flat in chunks:
        m = len(offsets) - 1
        res, _ = stream.add(offsets, flat, prompt[at:at + m], block_size, rule, salts[at:at + m],
                            np.zeros(m, np.uint64))
        ideal[at:at + m] = res.cached_tokens
        same[at:at + m] = res.tenant_cached_tokens
        k_prev = np.zeros(m, np.int64)
        for i in range(m):
            h = flat[offsets[i]:offsets[i + 1]]
            r = reps[at + i]
            if r is not None and r in last:
                k_prev[i] = _lcp_blocks(h, last[r])
            last[r] = h
        prev_hit[at:at + m] = hit_tokens_array(k_prev, prompt[at:at + m], block_size, rule)
        at += m
    stream.release()
    if at != n:
        raise ValueError(f"the block chunks cover {at} requests, the table has {n}")
    return ideal, same, prev_hit


def attribute(req: pl.DataFrame, chunks: Chunks | None, block_size: int, rule: str,
              findings: list[Any], block_granular: bool = True, tokenizer_mismatch: bool = False) -> Attribution:
    """The misses table of a finished analysis. `req`: seq, request_id, model, replica, prompt_tokens,
    cached_tokens (block-granular), actual_cached_tokens, in analysis order; `chunks`: every request's
    block hashes (read only when the log names replicas, has engine values, or `cached_tokens` is not
    block-granular, i.e. `--granularity token`). `tokenizer_mismatch`: the log's own prompt token counts
    disagree with prefixscan's (ingest's check): every shortfall is then unexplained."""
    n = req.height
    if findings:
        gain, rank = breaker_credit(findings, req["request_id"].to_list())
    else:  # no finding credits anyone: no per-request Python strings (a 10M-request trace's ids)
        gain, rank = np.zeros(n, np.int64), np.full(n, -1, np.int64)
    # One distinct value says nothing about routing (a gateway often logs its one upstream URL): as absent.
    has_replica = n > 0 and req["replica"].drop_nulls().n_unique() >= 2
    if (has_replica or not block_granular or req["actual_cached_tokens"].null_count() < n) and chunks is not None:
        ideal, same, prev_hit = replica_pass(req, chunks, block_size, rule)  # block-granular I as well
        if not has_replica:
            same = ideal
    else:
        ideal = req["cached_tokens"].to_numpy().astype(np.int64)
        same, prev_hit = ideal, np.zeros(n, np.int64)
    actual_s = req["actual_cached_tokens"]
    has_a = actual_s.is_not_null().to_numpy()
    actual = actual_s.fill_null(0).to_numpy().astype(np.int64)
    gap = same - actual
    excess = np.maximum(-gap, 0)
    mismatch = _mismatched(req["model"], has_a, excess > 0) | tokenizer_mismatch
    short = np.maximum(gap, 0)
    if has_replica:
        unexplained = np.where(mismatch, short, np.clip(np.minimum(prev_hit, same) - actual, 0, None))
    else:
        unexplained = short
    eviction = short - unexplained

    def opt(values: np.ndarray, valid: np.ndarray) -> pa.Array:
        return pa.array(values, type=pa.int64(), mask=~valid)

    every = np.ones(n, np.bool_)
    rep_ok = every if has_replica else ~every
    table = pa.table({
        "seq": pa.array(req["seq"].to_numpy(), pa.int64()),
        "request_id": req["request_id"].to_arrow().cast(pa.string()),
        "replica": req["replica"].to_arrow().cast(pa.string()),
        "prompt_tokens": pa.array(req["prompt_tokens"].to_numpy(), pa.int64()),
        "counterfactual_cached_tokens": pa.array(ideal + gain, pa.int64()),
        "ideal_cached_tokens": pa.array(ideal, pa.int64()),
        "replica_cached_tokens": opt(same, rep_ok),
        "actual_cached_tokens": opt(actual, has_a),
        "lost_breaker_tokens": pa.array(gain, pa.int64()),
        "breaker_rank": opt(rank, rank >= 0),
        "lost_routing_tokens": opt(ideal - same, rep_ok),
        "lost_eviction_tokens": opt(eviction, has_a & rep_ok),
        "lost_unexplained_tokens": opt(unexplained, has_a),
        "engine_excess_tokens": opt(excess, has_a),
    }, schema=MISSES_SCHEMA)
    return Attribution(table, _summary(req, has_replica, ideal, same, actual, has_a, gain, eviction,
                                       unexplained, excess, mismatch))


COLUMNS = ["seq", "request_id", "model", "replica", "prompt_tokens", "cached_tokens", "actual_cached_tokens"]


def table_chunks(requests: pa.Table | str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(local CSR offsets, block hashes) of a requests table in memory (one chunk) or on disk (one row group
    at a time)."""
    if isinstance(requests, pa.Table):
        groups: Iterable[pa.Array] = [requests.column("block_hashes").combine_chunks()]
    else:
        pf = pq.ParquetFile(requests)
        groups = (pf.read_row_group(g, columns=["block_hashes"]).column(0).combine_chunks()
                  for g in range(pf.num_row_groups))
    for lists in groups:
        offsets = lists.offsets.to_numpy().astype(np.int64)
        yield offsets - offsets[0], lists.values.to_numpy()[offsets[0]:offsets[-1]]


def attribute_table(requests: pa.Table | str, block_size: int, rule: str, findings: list[Any],
                    block_granular: bool = True, tokenizer_mismatch: bool = False) -> Attribution:
    """`attribute` over a requests table (REQUESTS_SCHEMA) in memory or a Parquet file."""
    t = requests.select(COLUMNS) if isinstance(requests, pa.Table) else pq.read_table(requests, columns=COLUMNS)
    return attribute(pl.from_arrow(t), table_chunks(requests), block_size, rule, findings,  # type: ignore[arg-type]
                     block_granular, tokenizer_mismatch)


def _mismatched(model: pl.Series, has_a: np.ndarray, over: np.ndarray) -> np.ndarray:
    """Per request: whether its model's engine values exceed the same-replica ideal on at least
    MISMATCH_SHARE of its requests with an engine value (the engine tokenises or templates differently)."""
    out = np.zeros(len(has_a), np.bool_)
    if not has_a.any():
        return out
    models = model.fill_null("").to_numpy()
    for m in np.unique(models[has_a]):
        sel = models == m
        with_a = sel & has_a
        if over[with_a].sum() >= MISMATCH_SHARE * with_a.sum():
            out |= sel
    return out


def _summary(req: pl.DataFrame, has_replica: bool, ideal: np.ndarray, same: np.ndarray, actual: np.ndarray,
             has_a: np.ndarray, gain: np.ndarray, eviction: np.ndarray, unexplained: np.ndarray,
             excess: np.ndarray, mismatch: np.ndarray) -> dict[str, Any]:
    """Totals over every request (breaker, routing) and over the requests with an engine value (all four:
    there they add up to counterfactual - actual + excess)."""
    a = has_a
    out: dict[str, Any] = {
        "replica_field": bool(has_replica),
        "replicas": int(req["replica"].drop_nulls().n_unique()) if has_replica else 0,
        "ideal_cached_tokens": int(ideal.sum()),
        "counterfactual_cached_tokens": int((ideal + gain).sum()),
        "lost_breaker_tokens": int(gain.sum()),
        "lost_routing_tokens": int((ideal - same).sum()) if has_replica else None,
        "requests_with_actual": int(a.sum()),
        "tokenizer_mismatch": bool(mismatch.all()) if len(mismatch) else False,
    }
    if a.any():
        out["with_actual"] = {
            "counterfactual_cached_tokens": int((ideal + gain)[a].sum()),
            "actual_cached_tokens": int(actual[a].sum()),
            "lost_breaker_tokens": int(gain[a].sum()),
            "lost_routing_tokens": int((ideal - same)[a].sum()) if has_replica else None,
            "lost_eviction_tokens": int(eviction[a].sum()) if has_replica else None,
            "lost_unexplained_tokens": int(unexplained[a].sum()),
            "engine_excess_tokens": int(excess[a].sum()),
            "requests_mismatched_model": int((mismatch & a).sum()),
        }
    return out
