"""The capacity curve's table and the pieces every way of computing it shares: the block weights (what a
matched block adds to its request's hit under each hit rule), the capacity grid, the table itself with its
targets and sampling metadata. The exact curve (`lru`), the streamed one (`capacity.stream`) and the
sampled one (`capacity.sampled`) all build on this module, which imports none of them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
from numba import njit

from prefixscan.encode.hashing import is_trace_rule
from prefixscan.reuse.hitrule import cap_tokens

SCHEMA = pa.schema([
    ("capacity_tokens", pa.int64()),
    ("capacity_blocks", pa.int64()),
    ("lru_hit_rate", pa.float64()),
    ("opt_hit_rate", pa.float64()),
    ("ideal_hit_rate", pa.float64()),
    ("lru_hit_tokens", pa.int64()),
    ("opt_hit_tokens", pa.int64()),
    ("ideal_hit_tokens", pa.int64()),
    ("total_prompt_tokens", pa.int64()),
    ("lru_sampled", pa.bool_()),
    ("sample_rate", pa.float64()),
    ("lru_hit_rate_low", pa.float64()),
    ("lru_hit_rate_high", pa.float64()),
])


@njit(cache=True, nogil=True)
def _block_weights(offsets, prompt_tokens, block_size, trace):  # pragma: no cover - compiled
    out = np.zeros(offsets[len(offsets) - 1], np.int64)
    for r in range(len(offsets) - 1):
        cap = cap_tokens(prompt_tokens[r], block_size, trace)
        for j in range(offsets[r + 1] - offsets[r]):
            out[offsets[r] + j] = min((j + 1) * block_size, cap) - min(j * block_size, cap)
    return out


def block_weights(offsets: np.ndarray, prompt_tokens: np.ndarray, block_size: int, rule: str) -> np.ndarray:
    """Per listed block, hit_tokens(j+1) - hit_tokens(j) for its position j, so that a request's hit for
    k matched blocks is the sum of its first k weights (and a histogram of weights gives every capacity).

    "vllm": B for j < floor((n-1)/B), else 0 (the last token is always recomputed); "trace": the block's
    true size min(B, n - jB), clipped at 0 (the partial last block counts at its size).
    """
    return _block_weights(np.ascontiguousarray(offsets, dtype=np.int64),
                          np.ascontiguousarray(prompt_tokens, dtype=np.int64), int(block_size), is_trace_rule(rule))


def default_capacities(working_set_blocks: int, block_size: int, points: int = 16) -> list[int]:
    """A log-spaced grid of capacities in tokens, from ~1/1000 of the working set up to all of it.

    The working set (distinct blocks x block size) is where LRU reaches the ideal hit, so the curve's
    interesting part lies below it. Points are whole blocks, increasing and distinct.
    """
    if working_set_blocks <= 0:
        return []
    lo = max(1.0, working_set_blocks / 1000.0)
    grid = np.unique(np.round(np.geomspace(lo, working_set_blocks, points)).astype(np.int64))
    return [int(c) * block_size for c in grid]


def _rate(hit: np.ndarray, total: int) -> np.ndarray:
    return hit / total if total > 0 else np.zeros(len(hit), np.float64)


def resolve_capacities(capacities_tokens: Sequence[int] | None, n_distinct: int,
                       block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(capacities in tokens, in blocks): the given ones, or the default grid; negative ones are refused."""
    if capacities_tokens is None:
        capacities_tokens = default_capacities(n_distinct, block_size)
    cap_tok = np.asarray(list(capacities_tokens), dtype=np.int64)
    if np.any(cap_tok < 0):
        raise ValueError("capacities must be non-negative token counts")
    return cap_tok, cap_tok // block_size


def curve_table(cap_tok: np.ndarray, cap_blk: np.ndarray, lru: np.ndarray, ideal_tok: int, total: int,
                opt_tok: np.ndarray | None, targets: dict[str, int | None],
                sampled: Sampling | None = None) -> pa.Table:
    """The capacity table from hit tokens per capacity (OPT null when `opt_tok` is None). With `sampled`,
    the `lru_*` columns are an estimate (`capacity.sampled`) with its band; its parameters go to the
    metadata too."""
    n = len(cap_tok)
    if opt_tok is not None:
        opt_cols = [pa.array(_rate(opt_tok, total), pa.float64()), pa.array(opt_tok, pa.int64())]
    else:
        opt_cols = [pa.nulls(n, pa.float64()), pa.nulls(n, pa.int64())]
    low, high = (sampled.low, sampled.high) if sampled is not None else (lru, lru)
    cols = [
        pa.array(cap_tok, pa.int64()),
        pa.array(cap_blk, pa.int64()),
        pa.array(_rate(lru, total), pa.float64()),
        opt_cols[0],
        pa.array(np.full(n, ideal_tok / total if total > 0 else 0.0), pa.float64()),
        pa.array(lru, pa.int64()),
        opt_cols[1],
        pa.array(np.full(n, ideal_tok, np.int64), pa.int64()),
        pa.array(np.full(n, total, np.int64), pa.int64()),
        pa.array(np.full(n, sampled is not None), pa.bool_()),
        pa.array(np.full(n, sampled.rate if sampled is not None else 1.0), pa.float64()),
        pa.array(_rate(np.asarray(low), total), pa.float64()),
        pa.array(_rate(np.asarray(high), total), pa.float64()),
    ]
    meta = {"targets": json.dumps(targets)}
    if sampled is not None:
        meta["sampling"] = json.dumps(sampled.meta)
    return pa.Table.from_arrays(cols, schema=SCHEMA.with_metadata(meta))


class Sampling(NamedTuple):
    """How a sampled `lru_*` column was made: its band (hit tokens per row) and parameters for the summary."""

    rate: float
    low: np.ndarray
    high: np.ndarray
    meta: dict


TARGET_FRACTIONS = (0.5, 0.9)
TARGET_NAMES = tuple(f"lru_tokens_for_{int(f * 100)}pct_of_ideal" for f in TARGET_FRACTIONS)  # the metadata's keys


def capacity_targets(curve: pa.Table) -> dict[str, int | None]:
    """The pool sizes (tokens) for 50% and 90% of the ideal hit that `capacity_curve` stored (estimated
    when the curve was sampled: see `capacity_sampling`)."""
    return _metadata(curve, b"targets", {})


def capacity_sampling(curve: pa.Table) -> dict | None:
    """The sampling parameters of a sampled curve (rate, salts, hot blocks, references kept, mean band
    width in points), or None for the exact curve."""
    return _metadata(curve, b"sampling", None)


def _metadata(curve: pa.Table, key: bytes, default: Any) -> Any:
    meta = curve.schema.metadata or {}
    return json.loads(meta[key]) if key in meta else default
