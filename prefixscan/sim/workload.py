"""The requests table turned into flat numpy arrays the replay can index without Python objects.

Block hashes become dense int32 ids (a compiled hash table), so every replica's cache is a set of
array slots and no per-request hashing happens during the replay. Tenant isolation salts every block
with the tenant before the remap, so two tenants' identical prompts never share a block (like vLLM's
`cache_salt`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from prefixscan.encode.hashing import HIT_RULES
from prefixscan.errors import UsageError
from prefixscan.reuse.hitrule import cap_tokens_array, hit_tokens_array
from prefixscan.schema import REPLAY_COLUMNS


@dataclass
class Workload:
    """One row per request in replay order (arrival, then seq)."""

    n: int
    request_id: np.ndarray  # object (str)
    seq: np.ndarray  # int64
    arrival_s: np.ndarray  # float64, after time compression
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    tenant: np.ndarray  # int32 code (-1 = none)
    conv_key: np.ndarray  # uint64: hash of the conversation id (0 = none)
    offsets: np.ndarray  # int64, len n+1
    blocks: np.ndarray  # int32 dense block ids, flattened
    n_unique: int
    block_keys: np.ndarray  # uint64 hash of each dense id (routing keys use it, not the id)
    block_size: int
    hit_rule: str
    ideal_cached: np.ndarray  # int64: unbounded single-cache hit in the same order (and salting)
    measured: np.ndarray  # bool: outside the warm-up window
    hit_cap: np.ndarray  # int64: most tokens a hit can cover (k blocks hit `hitrule.block_tokens`)
    next_in_conv: np.ndarray  # int64: the conversation's next request (-1: none)


def _mix(h: np.ndarray, salt: np.ndarray) -> np.ndarray:
    """splitmix64-style mix of a block hash with a per-block salt (tenant)."""
    with np.errstate(over="ignore"):
        z = h ^ (salt * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _string_keys(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """(int32 code per row, -1 for null; the distinct strings the codes index)."""
    enc = pc.dictionary_encode(col).combine_chunks()
    codes = enc.indices.to_numpy(zero_copy_only=False)
    codes = np.where(enc.is_null().to_numpy(zero_copy_only=False), -1, codes).astype(np.int32)
    return codes, [str(x) for x in enc.dictionary.to_pylist()]


def build_workload(
    table: pa.Table,
    block_size: int,
    hit_rule: str = "vllm",
    *,
    default_output_tokens: int = 128,
    isolate_tenants: bool = False,
    rate_scale: float = 1.0,
    target_rps: float | None = None,
    warmup_s: float = 0.0,
) -> Workload:
    """Validate and flatten a requests table; apply salting, time compression and the warm-up window."""
    missing = [c for c in REPLAY_COLUMNS if c not in table.column_names]
    if missing:
        raise UsageError(f"requests table lacks column(s) {', '.join(missing)}; re-run `prefixscan analyze`")
    if hit_rule not in HIT_RULES:
        raise UsageError(f"unknown hit rule {hit_rule!r} in the run manifest")
    if block_size < 1:
        raise UsageError(f"block size must be >= 1, got {block_size}")
    n = table.num_rows
    arrival = table["arrival_s"].to_numpy().astype(np.float64)
    seq = table["seq"].to_numpy().astype(np.int64)
    order = np.lexsort((seq, arrival))
    if not (order == np.arange(n)).all():  # analysis order is usually arrival order already
        table = table.take(pa.array(order))
        arrival = arrival[order]
        seq = seq[order]
    if n:
        arrival = arrival - arrival[0]
    if target_rps is not None and n > 1 and arrival[-1] > 0:
        from prefixscan.sim.rate import activity

        # compress (or stretch) so the busy periods run at the target rate (idle gaps do not dilute it)
        busy = arrival[-1] * activity(arrival).busy_fraction
        rate_scale = target_rps / ((n - 1) / busy) if busy > 0 else target_rps / ((n - 1) / arrival[-1])
    arrival = arrival / rate_scale
    prompt = table["prompt_tokens"].to_numpy().astype(np.int64)
    if "output_tokens" in table.column_names:
        out = table["output_tokens"].fill_null(default_output_tokens).to_numpy().astype(np.int64)
        out = np.maximum(out, 1)
    else:
        out = np.full(n, default_output_tokens, dtype=np.int64)
    tenant = _string_keys(table["tenant"])[0] if "tenant" in table.column_names else np.full(n, -1, np.int32)
    conv = np.zeros(n, dtype=np.uint64)
    if "conversation_id" in table.column_names:
        codes, names = _string_keys(table["conversation_id"])
        keys = np.array([xxhash.xxh3_64_intdigest(s.encode()) | 1 for s in names] or [0], dtype=np.uint64)
        conv = np.where(codes >= 0, keys[np.maximum(codes, 0)], np.uint64(0)).astype(np.uint64)
    bh = table["block_hashes"].combine_chunks()
    offsets = bh.offsets.to_numpy().astype(np.int64)
    offsets = offsets - offsets[0]
    flat = bh.values.to_numpy(zero_copy_only=False).astype(np.uint64)[: offsets[-1]] if n else np.zeros(0, np.uint64)
    if isolate_tenants and len(flat):
        per_block = np.repeat(tenant.astype(np.int64) + 2, np.diff(offsets)).astype(np.uint64)
        flat = _mix(flat, per_block)
    from prefixscan.encode.dense import dense_ids

    blocks, n_unique = dense_ids(flat)
    block_keys = np.zeros(n_unique, dtype=np.uint64)
    block_keys[blocks] = flat
    use_col = "cached_tokens" in table.column_names and not isolate_tenants and table["cached_tokens"].null_count == 0
    if use_col:
        ideal = table["cached_tokens"].to_numpy().astype(np.int64)
    else:  # the leading blocks an earlier request listed (an unbounded cache, prefix-closed)
        from prefixscan.reuse.ideal import leading_runs

        k = leading_runs(offsets, blocks, n_unique, np.ones(n, dtype=np.bool_))[0]
        ideal = hit_tokens_array(k, prompt, block_size, hit_rule)
    return Workload(
        n=n,
        request_id=np.asarray(table["request_id"].to_pylist(), dtype=object),
        seq=seq,
        arrival_s=arrival,
        prompt_tokens=prompt,
        output_tokens=out,
        tenant=tenant,
        conv_key=conv,
        offsets=offsets,
        blocks=blocks,
        n_unique=n_unique,
        block_keys=block_keys,
        block_size=block_size,
        hit_rule=hit_rule,
        ideal_cached=ideal,
        measured=arrival >= warmup_s,
        hit_cap=cap_tokens_array(prompt, block_size, hit_rule),
        next_in_conv=_next_in_conversation(conv),
    )


def _next_in_conversation(conv: np.ndarray) -> np.ndarray:
    """Index of the next request of the same conversation in replay order, -1 for the last or none."""
    nxt = np.full(len(conv), -1, dtype=np.int64)
    idx = np.flatnonzero(conv != 0)
    if len(idx) > 1:
        order = idx[np.lexsort((idx, conv[idx]))]
        same = conv[order[1:]] == conv[order[:-1]]
        nxt[order[:-1][same]] = order[1:][same]
    return nxt
