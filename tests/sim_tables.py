"""Small synthetic requests tables with chained block hashes, for simulator tests and benchmarks (a test
fixture, so it lives in tests/ rather than in the package).

Each conversation starts from one of a few shared system prompts and grows by whole blocks every turn,
so reuse comes from the shared system prompts (across conversations) and from conversation history
(within one). Ground truth is simple enough to reason about in tests; `prefixscan synth` makes the
realistic logs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

# The requests-table columns a simulation reads (a subset of the analyze schema), for synthetic workloads.
WORKLOAD_SCHEMA = pa.schema([
    ("seq", pa.int64()), ("request_id", pa.string()), ("arrival_s", pa.float64()), ("tenant", pa.string()),
    ("conversation_id", pa.string()), ("prompt_tokens", pa.int64()), ("output_tokens", pa.int64()),
    ("block_hashes", pa.list_(pa.uint64())),
])


def chain(contents: list[int], root: int = 0x51F15E) -> list[int]:
    """Chained 64-bit hashes of content ids: equal hash <=> equal whole prefix."""
    out, parent = [], root
    for c in contents:
        parent = xxhash.xxh3_64_intdigest(int(c).to_bytes(8, "little"), seed=parent)
        out.append(parent)
    return out


def conversations_table(
    n_conversations: int = 50,
    turns: int = 4,
    *,
    block_size: int = 16,
    system_prompts: int = 3,
    system_blocks: int = 8,
    turn_blocks: tuple[int, int] = (1, 6),
    rate_rps: float = 5.0,
    think_s: float = 10.0,
    output_tokens: tuple[int, int] = (16, 256),
    tenants: int = 2,
    seed: int = 0,
) -> pa.Table:
    """A requests table (analysis order, `arrival_s` from 0) of multi-turn conversations.

    `system_prompts=0` gives every conversation a private system prompt (no cross-conversation reuse).
    """
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    starts = np.cumsum(rng.exponential(1.0 / rate_rps * turns, size=n_conversations))
    nxt = 1 << 40
    for c in range(n_conversations):
        if system_prompts > 0:  # shared system prompt
            sp = int(rng.integers(system_prompts))
            contents = [sp * 1000 + j for j in range(system_blocks)]
        else:  # private: nothing shared across conversations
            contents = list(range(nxt, nxt + system_blocks))
            nxt += system_blocks
        t = float(starts[c])
        tenant = f"tenant-{c % max(tenants, 1)}"
        for turn in range(turns):
            k = int(rng.integers(turn_blocks[0], turn_blocks[1] + 1))
            contents = contents + list(range(nxt, nxt + k))
            nxt += k
            tail = int(rng.integers(0, block_size))
            rows.append(
                {
                    "request_id": f"c{c}-t{turn}",
                    "arrival_s": t,
                    "tenant": tenant,
                    "conversation_id": f"c{c}",
                    "prompt_tokens": len(contents) * block_size + tail,
                    "output_tokens": int(rng.integers(output_tokens[0], output_tokens[1] + 1)),
                    "block_hashes": chain(contents),
                }
            )
            t += float(rng.exponential(think_s))
    rows.sort(key=lambda r: (r["arrival_s"], r["request_id"]))
    t0 = rows[0]["arrival_s"] if rows else 0.0
    for i, r in enumerate(rows):
        r["seq"] = i
        r["arrival_s"] -= t0
    return pa.Table.from_pylist(rows, schema=WORKLOAD_SCHEMA)
