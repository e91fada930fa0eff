"""What one policy's replay produces (`Outcome`) and the per-request block budgets both replay engines
(the reference loop in `engine.py`, the compiled one in `fast/`) derive from a workload."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prefixscan.reuse.hitrule import cap_blocks_array
from prefixscan.sim.config import SimConfig
from prefixscan.sim.kvcache import kv_tokens
from prefixscan.sim.workload import Workload


@dataclass
class Outcome:
    """Per-request arrays (workload order) and per-replica counters of one policy's replay."""

    policy: str
    n_slots: int
    replica: np.ndarray
    start_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    cached_tokens: np.ndarray
    predicted_cached: np.ndarray
    best_cached: np.ndarray  # most cached tokens any active replica held at routing (exact)
    routed_cached: np.ndarray  # cached tokens the chosen replica held at routing (exact)
    routed_blocks: np.ndarray  # leading blocks the chosen replica held at routing (exact)
    prefill_s: np.ndarray
    reason: np.ndarray  # int16 code into `reasons`
    reasons: list[str]
    cand_ids: np.ndarray  # int32: every request's candidate replicas, best first, concatenated
    cand_off: np.ndarray  # int64 [n + 1]: request i's candidates are cand_ids[cand_off[i]:cand_off[i + 1]]
    evictions: np.ndarray
    evict_age_sum: np.ndarray
    evict_hist: np.ndarray
    area_outstanding: np.ndarray  # integral of in-flight requests over time, per replica
    area_waiting: np.ndarray
    horizon_s: float
    oversized: int
    knowledge: str
    extra: dict = field(default_factory=dict)
    tiers: dict = field(default_factory=dict)  # per-request tier / disaggregation arrays and counters


def _capacity(cfg: SimConfig, w: Workload) -> int:
    if cfg.unbounded_kv:
        # every block any request could pin at once, so nothing is ever evicted
        return int(w.offsets[-1]) + int(w.output_tokens.sum() // max(w.block_size, 1)) + 2 * w.n + 1
    if cfg.kv_blocks is not None:
        return int(cfg.kv_blocks)
    from prefixscan.sim.timing import kv_capacity_blocks

    return kv_capacity_blocks(
        cfg.model, cfg.gpu, cfg.dtype, w.block_size, cfg.tensor_parallel, cfg.gpu_memory_utilization
    )


def request_budget(w: Workload, cfg: SimConfig, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(listed blocks, pinned prompt blocks, other blocks of the table, oversized count) per request.

    A request's block table (vLLM's block pool, `kvcache.py`) holds its full prompt blocks (truncated if
    they exceed a whole replica, whose block 0 is the null block), then its partial last prompt block
    and, with `reserve_decode_blocks`, the blocks of the tokens it computes while decoding (`kv_tokens`).
    """
    usable = max(capacity - 1, 0)
    nb = np.diff(w.offsets)
    computed = kv_tokens(w.prompt_tokens, w.output_tokens) if cfg.reserve_decode_blocks else w.prompt_tokens
    total = np.maximum(nb, -(-computed // w.block_size))
    pin_n = np.minimum(nb, usable)
    extra = np.minimum(total - nb, usable - pin_n)
    return nb, pin_n, extra, int((nb > usable).sum())


def max_hit_blocks(w: Workload, pin: np.ndarray) -> np.ndarray:
    """Most leading blocks a request's lookup may use: its hit cap in whole blocks (`hitrule.cap_blocks`),
    within its pinned blocks."""
    return np.minimum(pin, cap_blocks_array(w.prompt_tokens, w.block_size, w.hit_rule))


def offsets(counts: np.ndarray) -> np.ndarray:
    """Where each request's run of `counts` entries (its block table, its candidates) starts in one flat
    array; the last entry is the array's size."""
    off = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    return off
