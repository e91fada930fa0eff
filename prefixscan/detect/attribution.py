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

R and the hit on the previous request the same replica served (P) come from the replica pass
(`replica_pass`), one row group of the requests table at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numba import njit

from prefixscan.reuse.hitrule import hit_tokens_array
from prefixscan.reuse.ideal import IdealStream, scope_salts

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

COLUMNS = ["seq", "request_id", "model", "replica", "prompt_tokens", "cached_tokens", "actual_cached_tokens"]


class _Source:
    """The requests table's columns and block hashes, one row group at a time: a Parquet file's groups,
    or a table in memory as one group. Each pass reads only the columns it needs, so memory stays at a
    row group's columns."""

    def __init__(self, requests: pa.Table | str) -> None:
        self.requests = requests
        self.file = pq.ParquetFile(requests) if isinstance(requests, str) else None

    def groups(self, columns: list[str]) -> Iterator[pl.DataFrame]:
        if self.file is not None:
            for g in range(self.file.num_row_groups):
                yield pl.from_arrow(self.file.read_row_group(g, columns=columns))  # type: ignore[misc]
        else:
            yield pl.from_arrow(self.requests.select(columns))  # type: ignore[misc,union-attr]  # a str is self.file

    def with_blocks(self, columns: list[str]) -> Iterator[tuple[pl.DataFrame, tuple[np.ndarray, np.ndarray]]]:
        """Each group's columns beside its (local CSR offsets, block hashes)."""
        return zip(self.groups(columns), table_chunks(self.requests), strict=True)


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


class _Credit:
    """Per request id: the tokens it gains once every finding is fixed, and the rank of the finding with
    the largest gain (-1 if none). Held for the findings' requests only, looked up one group at a time."""

    def __init__(self, findings: list[Any]) -> None:
        gain: dict[str, int] = {}
        best: dict[str, tuple[int, int]] = {}
        for f in findings:
            for rid, g in zip(f.request_ids, f.request_gains or [0] * len(f.request_ids), strict=True):
                gain[rid] = gain.get(rid, 0) + g
                if g > best.get(rid, (0, -1))[0]:
                    best[rid] = (g, f.rank)
        self.ids = pa.array(list(gain), pa.string())
        self.gain = np.maximum(np.fromiter(gain.values(), np.int64, len(gain)), 0)
        self.rank = np.array([best.get(r, (0, -1))[1] for r in gain], np.int64)

    def of(self, request_id: pl.Series) -> tuple[np.ndarray, np.ndarray]:
        n = len(request_id)
        if not len(self.ids):  # no finding credits anyone: no per-request strings (a 10M-request trace's ids)
            return np.zeros(n, np.int64), np.full(n, -1, np.int64)
        at = pc.index_in(request_id.to_arrow().cast(pa.string()), value_set=self.ids)
        found = at.is_valid().to_numpy(zero_copy_only=False)
        idx = at.fill_null(0).to_numpy(zero_copy_only=False)
        return np.where(found, self.gain[idx], 0), np.where(found, self.rank[idx], -1)


@dataclass
class _Scope:
    """What the whole log decides before any row: its size, its distinct replicas, engine values at all."""

    n: int = 0
    replicas: set[str] = field(default_factory=set)
    with_actual: int = 0

    @property
    def has_replica(self) -> bool:
        # One distinct value says nothing about routing (a gateway often logs its one upstream URL): as absent.
        return len(self.replicas) >= 2


def _scope(src: _Source) -> _Scope:
    s = _Scope()
    for g in src.groups(["replica", "actual_cached_tokens"]):
        s.n += g.height
        s.replicas.update(g["replica"].drop_nulls().unique().to_list())
        s.with_actual += g.height - g["actual_cached_tokens"].null_count()
    return s


class _Groups:
    """Per row group: the hits I, R, P (from the replica pass, or I = R = the table's block-granular
    `cached_tokens`, P = 0) beside the group's columns."""

    def __init__(self, src: _Source, scope: _Scope, block_size: int, rule: str, block_granular: bool) -> None:
        self.src = src
        need = scope.has_replica or not block_granular or scope.with_actual > 0
        self.passed = (replica_pass(src.with_blocks(["prompt_tokens", "replica"]), scope.n, sorted(scope.replicas),
                                    block_size, rule) if need else None)
        self.has_replica = scope.has_replica

    def __call__(self, columns: list[str]) -> Iterator[tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray]]:
        at = 0
        cols = columns if self.passed is not None else sorted({*columns, "cached_tokens"}, key=COLUMNS.index)
        for g in self.src.groups(cols):
            m = g.height
            if self.passed is None:
                ideal = g["cached_tokens"].to_numpy().astype(np.int64)
                yield g, ideal, ideal, np.zeros(m, np.int64)
            else:
                ideal, same, prev = (a[at:at + m] for a in self.passed)
                yield g, ideal, same if self.has_replica else ideal, prev
            at += m


def attribute_groups(requests: pa.Table | str, block_size: int, rule: str, findings: list[Any],
                     block_granular: bool = True, tokenizer_mismatch: bool = False
                     ) -> tuple[Iterator[pa.Table], Totals]:
    """(the misses table of a requests table in memory or a Parquet file, one row group at a time; its
    totals, complete once the groups are consumed). Memory stays at a row group's columns, plus the replica
    pass's seen blocks and results when it runs.

    Three passes over the row groups before the rows: the log's replicas and engine values, the replica
    pass (only when the log names replicas, has engine values, or `cached_tokens` is not block-granular,
    i.e. `--granularity token`), and the models whose engine values exceed R (only with engine values)."""
    src = _Source(requests)
    scope = _scope(src)
    hits = _Groups(src, scope, block_size, rule, block_granular)
    mismatched = _mismatched(hits) if scope.with_actual else set()
    totals = Totals(scope, tokenizer_mismatch)

    def tables() -> Iterator[pa.Table]:
        credit = _Credit(findings)
        for g, ideal, same, prev in hits(["seq", "request_id", "model", "replica", "prompt_tokens",
                                          "actual_cached_tokens"]):
            gain, rank = credit.of(g["request_id"])
            mismatch = (g["model"].fill_null("").is_in(list(mismatched)).to_numpy() if mismatched
                        else np.zeros(g.height, np.bool_)) | tokenizer_mismatch
            yield _rows(g, ideal, same, prev, gain, rank, mismatch, scope.has_replica, totals)

    return tables(), totals


def _rows(g: pl.DataFrame, ideal: np.ndarray, same: np.ndarray, prev_hit: np.ndarray, gain: np.ndarray,
          rank: np.ndarray, mismatch: np.ndarray, has_replica: bool, totals: Totals) -> pa.Table:
    """One row group of the misses table (and its share of the totals)."""
    actual_s = g["actual_cached_tokens"]
    has_a = actual_s.is_not_null().to_numpy()
    actual = actual_s.fill_null(0).to_numpy().astype(np.int64)
    gap = same - actual
    excess = np.maximum(-gap, 0)
    short = np.maximum(gap, 0)
    if has_replica:
        unexplained = np.where(mismatch, short, np.clip(np.minimum(prev_hit, same) - actual, 0, None))
    else:
        unexplained = short
    eviction = short - unexplained
    totals.add(ideal, same, actual, has_a, gain, eviction, unexplained, excess, mismatch)

    def opt(values: np.ndarray, valid: np.ndarray) -> pa.Array:
        return pa.array(values, type=pa.int64(), mask=~valid)

    every = np.ones(g.height, np.bool_)
    rep_ok = every if has_replica else ~every
    return pa.table({
        "seq": pa.array(g["seq"].to_numpy(), pa.int64()),
        "request_id": g["request_id"].to_arrow().cast(pa.string()),
        "replica": g["replica"].to_arrow().cast(pa.string()),
        "prompt_tokens": pa.array(g["prompt_tokens"].to_numpy(), pa.int64()),
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


def _mismatched(hits: _Groups) -> set[str]:
    """The models (null as "") whose engine values exceed the same-replica ideal on at least MISMATCH_SHARE
    of their requests with an engine value (the engine tokenises or templates differently)."""
    with_a: dict[str, int] = {}
    over: dict[str, int] = {}
    for g, _, same, _ in hits(["model", "actual_cached_tokens"]):
        a = g["actual_cached_tokens"]
        counted = pl.DataFrame({"model": g["model"].fill_null(""), "has_a": a.is_not_null(),
                                "over": a.fill_null(0).to_numpy() > same})
        per = counted.filter("has_a").group_by("model").agg(pl.len(), pl.col("over").sum())
        for m, k, o in per.iter_rows():
            with_a[m], over[m] = with_a.get(m, 0) + k, over.get(m, 0) + o
    return {m for m, k in with_a.items() if over[m] >= MISMATCH_SHARE * k}


class Totals:
    """The summary's `miss_attribution`, summed one row group at a time: over every request (breaker,
    routing) and over the requests with an engine value (all four: there they add up to counterfactual -
    actual + excess)."""

    SUMS = ("counterfactual_cached_tokens", "actual_cached_tokens", "lost_breaker_tokens", "lost_routing_tokens",
            "lost_eviction_tokens", "lost_unexplained_tokens", "engine_excess_tokens", "requests_mismatched_model")

    def __init__(self, scope: _Scope, tokenizer_mismatch: bool) -> None:
        self.scope = scope
        self.ideal = self.gain = self.routing = self.with_actual = 0
        self.all_mismatched = True
        self.actual = dict.fromkeys(self.SUMS, 0)

    def add(self, ideal: np.ndarray, same: np.ndarray, actual: np.ndarray, a: np.ndarray, gain: np.ndarray,
            eviction: np.ndarray, unexplained: np.ndarray, excess: np.ndarray, mismatch: np.ndarray) -> None:
        self.ideal += int(ideal.sum())
        self.gain += int(gain.sum())
        self.routing += int((ideal - same).sum())
        self.with_actual += int(a.sum())
        self.all_mismatched &= bool(mismatch.all())
        parts = (ideal + gain, actual, gain, ideal - same, eviction, unexplained, excess, mismatch)
        for key, values in zip(self.SUMS, parts, strict=True):
            self.actual[key] += int(values[a].sum())

    def summary(self) -> dict[str, Any]:
        """The totals; call once every group has been consumed."""
        rep = self.scope.has_replica
        out: dict[str, Any] = {
            "replica_field": rep,
            "replicas": len(self.scope.replicas) if rep else 0,
            "ideal_cached_tokens": self.ideal,
            "counterfactual_cached_tokens": self.ideal + self.gain,
            "lost_breaker_tokens": self.gain,
            "lost_routing_tokens": self.routing if rep else None,
            "requests_with_actual": self.with_actual,
            "tokenizer_mismatch": self.all_mismatched if self.scope.n else False,
        }
        if self.with_actual:
            w: dict[str, int | None] = dict(self.actual)
            for key in ("lost_routing_tokens", "lost_eviction_tokens"):
                w[key] = w[key] if rep else None
            out["with_actual"] = w
        return out


@njit(cache=True, nogil=True)
def _previous_lcp(offsets: np.ndarray, flat: np.ndarray, codes: np.ndarray, first: int,
                  n_codes: int) -> tuple[np.ndarray, np.ndarray]:
    """(per request from `first` on: its common block prefix with the last earlier request of the same
    replica code, 0 if none or the code is < 0; the index of each code's last request, -1 if none)."""
    n = len(offsets) - 1
    last = np.full(n_codes, -1, np.int64)
    k = np.zeros(max(n - first, 0), np.int64)
    for i in range(n):
        c = codes[i]
        if c < 0:
            continue
        j = last[c]
        if i >= first and j >= 0:
            a, b = offsets[j], offsets[i]
            m = min(offsets[j + 1] - a, offsets[i + 1] - b)
            t = 0
            while t < m and flat[a + t] == flat[b + t]:
                t += 1
            k[i - first] = t
        last[c] = i
    return k, last


class LastPerReplica:
    """The block hashes of the last request each replica served, carried from one row group to the next
    (copies: a view would keep a whole group's hashes alive)."""

    def __init__(self, replicas: list[str]) -> None:
        self.index = {r: i for i, r in enumerate(replicas)}
        self.salts = scope_salts(replicas)  # the scope salt of each replica code
        self.kept: dict[int, np.ndarray] = {}

    def codes(self, replica: pl.Series) -> np.ndarray:
        """Each request's replica code (-1: none)."""
        if not self.index:
            return np.full(len(replica), -1, np.int64)
        return replica.replace_strict(self.index, return_dtype=pl.Int64).fill_null(-1).to_numpy()

    def previous(self, offsets: np.ndarray, flat: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Per request of a group: its common block prefix with the last earlier request of its replica."""
        held = sorted(self.kept)
        lens = np.array([len(self.kept[c]) for c in held], np.int64)
        pre = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        all_off = np.concatenate([pre, offsets[1:] + pre[-1]])
        all_flat = np.concatenate([*(self.kept[c] for c in held), flat]) if held else flat
        k, last = _previous_lcp(all_off, all_flat, np.concatenate([np.array(held, np.int64), codes]),
                                len(held), len(self.index))
        for c in np.flatnonzero(last >= len(held)).tolist():
            j = last[c]
            self.kept[c] = all_flat[all_off[j]:all_off[j + 1]].copy()
        return k


def replica_pass(groups: Iterable[tuple[pl.DataFrame, tuple[np.ndarray, np.ndarray]]], n: int,
                 replicas: list[str], block_size: int, rule: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ideal I, same-replica ideal R, hit on the previous request of the same replica P) per request.

    One ideal pass with the replica as the scope (the scope salt), plus, per request, the common block
    prefix with the last request the same replica served (kept per replica: a handful of arrays). Reads
    one row group at a time; the three results are held for the whole log (24 bytes a request), since the
    model mismatch check needs every R before any row is final. `groups`: per row group, its
    prompt_tokens and replica columns and its (local CSR offsets, block hashes); `replicas`: the log's
    distinct replicas."""
    ideal, same, prev_hit = (np.zeros(n, np.int64) for _ in range(3))
    stream = IdealStream()
    last = LastPerReplica(replicas)
    at = 0
    for g, (offsets, flat) in groups:
        m = len(offsets) - 1
        if m != g.height:
            raise ValueError(f"a block chunk covers {m} requests, its row group has {g.height}")
        prompt, codes = g["prompt_tokens"].to_numpy().astype(np.int64), last.codes(g["replica"])
        salts = np.zeros(m, np.uint64)
        salts[codes >= 0] = last.salts[codes[codes >= 0]]
        res, _ = stream.add(offsets, flat, prompt, block_size, rule, salts, np.zeros(m, np.uint64))
        ideal[at:at + m] = res.cached_tokens
        same[at:at + m] = res.tenant_cached_tokens
        prev_hit[at:at + m] = hit_tokens_array(last.previous(offsets, flat, codes), prompt, block_size, rule)
        at += m
    stream.release()
    if at != n:
        raise ValueError(f"the block chunks cover {at} requests, the table has {n}")
    return ideal, same, prev_hit
