"""Chained block hashes, namespaces and salts, and the engines' hit-length rules.

A block's hash is xxh3-64 over its parent's hash (8 bytes, little-endian) followed by its token ids
(uint32, little-endian), so equal hashes mean equal whole prefixes and
cache hits are prefix-closed (REFERENCE.md 1). prefixscan uses xxh3-64 for speed; hit *behaviour* does not
depend on the hash function, only hash *values* do.
"""

from __future__ import annotations

import numpy as np
import xxhash

ROOT_SEED = 0x9E3779B97F4A7C15  # fixed, so runs are reproducible across processes
HIT_RULES = ("vllm", "trace")


def _h(data: bytes, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def namespace_hash(model: str | None, tokenizer_id: str, adapter: str | None, template_version: str,
                   cache_salt: str | None = None, tenant_salt: str | None = None) -> int:
    """Root of a request's chain: requests in different namespaces can never share a block.

    The namespace covers what makes KV incompatible (model, tokenizer, LoRA adapter, prompt template
    version) plus vLLM's per-request `cache_salt` and, with `--isolate-tenants`, the tenant.
    """
    parts = [
        f"model={model or ''}",
        f"tokenizer={tokenizer_id}",
        f"adapter={adapter or ''}",
        f"template={template_version}",
        f"salt={cache_salt or ''}",
        f"tenant={tenant_salt or ''}",
    ]
    return _h("\x1f".join(parts).encode("utf-8"), ROOT_SEED)


def block_hashes(tokens: np.ndarray, block_size: int, root: int) -> np.ndarray:
    """Chained xxh3-64 hashes of the *full* blocks of `tokens` (uint32 ids), as uint64."""
    toks = np.ascontiguousarray(tokens, dtype="<u4")
    n_full = len(toks) // block_size
    out = np.empty(n_full, dtype=np.uint64)
    buf = toks[: n_full * block_size].tobytes()
    step = block_size * 4
    parent = root
    for i in range(n_full):
        # The parent goes into the hashed bytes, not the seed: xxh3's seed enters its mixing almost
        # linearly, so (parent, block) pairs with related values could collide when used as the seed.
        parent = _h(parent.to_bytes(8, "little") + buf[i * step : (i + 1) * step], 0)
        out[i] = parent
    return out


def mix_ids(ids: np.ndarray, root: int) -> np.ndarray:
    """Put a hashed trace's block ids into a namespace, vectorised (splitmix64 finaliser of id + root).

    A trace's ids are already prefix hashes (equal id = equal whole prefix within its id space), so a
    bijective mix with the namespace root keeps that, and traces in different namespaces (another file,
    model, tenant salt) never share an id.
    """
    return mix_ids_per(ids, np.uint64(root))


def mix_ids_per(ids: np.ndarray, roots: np.ndarray | np.uint64) -> np.ndarray:
    """`mix_ids` with a root per id (a batch of requests in one call)."""
    with np.errstate(over="ignore"):
        z = np.asarray(ids, dtype=np.int64).astype(np.uint64) + np.asarray(roots, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def block_token_counts(n_blocks: int, prompt_tokens: int, block_size: int) -> np.ndarray:
    """Tokens covered by each listed block: full blocks, except a trace's partial last block."""
    sizes = np.full(n_blocks, block_size, dtype=np.int64)
    if n_blocks:
        sizes[-1] = min(block_size, prompt_tokens - (n_blocks - 1) * block_size)
    return sizes


def hit_tokens(k_blocks: int, prompt_tokens: int, block_size: int, rule: str = "vllm") -> int:
    """Cached tokens of a request whose first `k_blocks` listed blocks are cached.

    - "vllm": min(k, floor((n-1)/B)) * B; the last prompt token is always recomputed (REFERENCE.md 1).
    - "trace": hashed traces list a partial last block; matched blocks count at their true size, as the
      Mooncake paper and AIPerf count them (REFERENCE.md 8).
    """
    if k_blocks <= 0 or prompt_tokens <= 0:
        return 0
    if rule == "vllm":
        return min(k_blocks, (prompt_tokens - 1) // block_size) * block_size
    if rule == "trace":
        return min(k_blocks * block_size, prompt_tokens)
    raise ValueError(f"unknown hit rule {rule!r}; expected one of {HIT_RULES}")


class ChainCache:
    """Resume a request's hash chain where an earlier request with the same leading segments stopped.

    Multi-turn chats resend the whole history, so turn t+1 starts with exactly the segments (messages,
    tool blocks) of turn t. A rolling key over segment content identifies "the same tokens up to here";
    at a few boundaries per request (end of the system-and-tools head, end of the history) the chain's
    block hashes are remembered, and a later request that shares those segments hashes only what follows.
    The result is identical to `block_hashes` on the whole prompt (tests check it); only the work shrinks.
    """

    def __init__(self, max_entries: int = 2_000_000) -> None:
        self._d: dict[int, tuple[np.ndarray, int]] = {}
        self.max_entries = max_entries
        self.blocks_hashed = 0
        self.blocks_reused = 0

    def hashes(self, tokens: np.ndarray, block_size: int, root: int, piece_keys: list[bytes],
               piece_lens: list[int], checkpoints: list[int]) -> np.ndarray:
        """Block hashes of `tokens` (the concatenation of the pieces), reusing remembered chain prefixes."""
        rolls = []
        r = root
        for k in piece_keys:
            r = _h(r.to_bytes(8, "little") + k, 0)
            rolls.append(r)
        ends = np.cumsum(piece_lens, dtype=np.int64) if piece_lens else np.zeros(0, np.int64)
        start, prefix = 0, None
        for j in range(len(rolls) - 1, -1, -1):
            hit = self._d.get(rolls[j])
            if hit is not None and hit[1] == ends[j] // block_size:
                prefix, start = hit[0][: hit[1]], hit[1]
                break
        parent = int(prefix[-1]) if start else root
        new = block_hashes(tokens[start * block_size:], block_size, parent)
        out = np.concatenate([prefix, new]) if start else new
        self.blocks_hashed += len(new)
        self.blocks_reused += start
        if len(self._d) + len(checkpoints) > self.max_entries:
            self._d.clear()
        for j in checkpoints:
            if 0 <= j < len(rolls):
                self._d[rolls[j]] = (out, int(ends[j] // block_size))
        return out
