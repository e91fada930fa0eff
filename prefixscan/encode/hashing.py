"""Chained block hashes, namespaces and salts, and the engines' hit-length rules.

A block's hash is xxh3-64 over its parent's hash (8 bytes, little-endian) followed by its token ids
(uint32, little-endian), so equal hashes mean equal whole prefixes and
cache hits are prefix-closed (docs/engines.md, 'Block hashing'). prefixscan uses xxh3-64 for speed; hit
*behaviour* does not depend on the hash function, only hash *values* do.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from itertools import accumulate
from typing import Any

import numpy as np
import xxhash

from prefixscan.encode import core as encode_core

ROOT_SEED = 0x9E3779B97F4A7C15  # fixed, so runs are reproducible across processes
HIT_RULES = ("vllm", "trace")
# Bound of a ChainCache's remembered chain prefixes (8 bytes a block, shared parts counted each time, so
# the memory held is at most this). Only speed depends on it: a forgotten prefix is hashed again.
CHAIN_CACHE_BYTES = 64 << 20


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
    fast = encode_core.core()
    if fast is not None:  # the same chain, its loop compiled
        out = fast.block_chain(toks, block_size, root, xxhash.xxh3_64_intdigest)
        return np.frombuffer(out, dtype=np.uint64) if out else np.zeros(0, dtype=np.uint64)
    n_full = len(toks) // block_size
    buf = toks[: n_full * block_size].tobytes()
    step = block_size * 4
    h = xxhash.xxh3_64_intdigest
    out = [0] * n_full  # a list, then one conversion: a numpy scalar store per block cost a third more
    parent = root
    for i in range(n_full):
        # The parent goes into the hashed bytes, not the seed: xxh3's seed enters its mixing almost
        # linearly, so (parent, block) pairs with related values could collide when used as the seed.
        parent = h(parent.to_bytes(8, "little") + buf[i * step : (i + 1) * step])
        out[i] = parent
    return np.array(out, dtype=np.uint64)


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


def hit_cap_tokens(prompt_tokens: int, block_size: int, trace: bool) -> int:
    """Most prompt tokens a cache hit can cover: the one home of the engines' hit rule.

    - vLLM (`trace` false): floor((n-1)/B) * B; the last prompt token is always recomputed (a full prompt
      hit is capped one block short, so at least one token is computed) (docs/engines.md, 'The hit rule').
    - hashed traces (`trace` true): n; a trace lists its partial last block and matched blocks count at
      their true size, as the Mooncake paper and AIPerf count them
      (docs/engines.md, 'Public traces').

    A request whose first k listed blocks are cached saves min(k * B, this) tokens (0 when k is 0). Plain
    integer arithmetic, so the compiled kernels run this very function (`reuse/hitrule.py`).
    """
    if prompt_tokens <= 0:
        return 0
    if trace:
        return prompt_tokens
    return (prompt_tokens - 1) // block_size * block_size


def is_trace_rule(rule: str) -> bool:
    """The hit rule by name, as `hit_cap_tokens` takes it: "trace" true, "vllm" false, else a ValueError."""
    if rule not in HIT_RULES:
        raise ValueError(f"unknown hit rule {rule!r}; expected one of {HIT_RULES}")
    return rule == "trace"


def hit_tokens(k_blocks: int, prompt_tokens: int, block_size: int, rule: str = "vllm") -> int:
    """Cached tokens of a request whose first `k_blocks` listed blocks are cached (`hit_cap_tokens`)."""
    trace = is_trace_rule(rule)
    return min(k_blocks * block_size, hit_cap_tokens(prompt_tokens, block_size, trace)) if k_blocks > 0 else 0


def counted_hit_blocks(cached_tokens: Any, cached_blocks: Any, block_size: int, rule: str) -> Any:
    """Blocks a request's hit counts in the block-weighted rate (ints, arrays or polars expressions).

    vLLM serves the whole blocks of its cached tokens (`hit_cap_tokens`: a capped full hit leaves its
    last matched block recomputed, so it does not count); a trace's matched blocks count, partial last
    one included.
    """
    return cached_tokens // block_size if rule == "vllm" else cached_blocks


class BytesLRU:
    """A dict bounded by the bytes its values are said to take, least recently used out first.

    For caches whose entries are worth keeping while in use but never needed for correctness.
    """

    def __init__(self, max_bytes: int) -> None:
        self._d: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._d)

    def get(self, key: Hashable) -> Any:
        hit = self._d.get(key)
        if hit is None:
            return None
        self._d.move_to_end(key)
        return hit[0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        old = self._d.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._d[key] = (value, size)
        self.bytes += size
        while self.bytes > self.max_bytes and len(self._d) > 1:
            _, (_, n) = self._d.popitem(last=False)
            self.bytes -= n
            self.evicted += 1

    def pop(self, key: Hashable) -> None:
        old = self._d.pop(key, None)
        if old is not None:
            self.bytes -= old[1]

    def clear(self) -> None:
        self._d.clear()
        self.bytes = 0


class ChainCache:
    """Resume a request's hash chain where an earlier request with the same leading segments stopped.

    Multi-turn chats resend the whole history, so turn t+1 starts with exactly the segments (messages,
    tool blocks) of turn t. A key over the root and the segment keys so far identifies "the same tokens up
    to here"; at a few boundaries per request (end of the system-and-tools head, end of the history) the
    chain's block hashes are remembered, and a later request that shares those segments hashes only what follows.
    The result is identical to `block_hashes` on the whole prompt (tests check it); only the work shrinks.
    """

    def __init__(self, max_bytes: int | None = None, hasher: Any = None) -> None:
        self._d = BytesLRU(CHAIN_CACHE_BYTES if max_bytes is None else max_bytes)
        self.blocks_hashed = 0
        self.blocks_reused = 0
        # None: prefixscan's xxh3-64 chain; else a `vllm_hash.VllmHasher` (vLLM's own values, --hash vllm:*)
        self.hasher = hasher
        self.lora_paths: dict[str, str] = {}  # adapter name -> path, for vLLM's ("lora", name, path) key

    def plain(self, tokens: np.ndarray, block_size: int, root: int, keys: Any = None) -> np.ndarray:
        """Block hashes of a whole prompt without resuming (prompts that come without pieces)."""
        if self.hasher is None:
            return block_hashes(tokens, block_size, root)
        return self.hasher.hashes(tokens, block_size, None, 0, keys)

    def hashes(self, tokens: np.ndarray, block_size: int, root: int, piece_keys: list[bytes],
               piece_lens: list[int], checkpoints: list[int], keys: Any = None) -> np.ndarray:
        """Block hashes of `tokens` (the concatenation of the pieces), reusing remembered chain prefixes."""
        segs = self.segments(tokens, block_size, root, piece_keys, piece_lens, checkpoints, keys)
        return segs[0] if len(segs) == 1 and segs[0].flags.writeable else np.concatenate(segs)

    def segments(self, tokens: np.ndarray, block_size: int, root: int, piece_keys: list[bytes],
                 piece_lens: list[int], checkpoints: list[int], keys: Any = None) -> list[np.ndarray]:
        """`hashes` as consecutive parts: views of remembered prefixes (shared, read-only) and the
        freshly hashed rest. Holding these instead of one array keeps a conversation's history once.
        `keys` are the request's vLLM extra keys (`vllm_hash.RequestKeys`) when `hasher` is set."""
        fast = encode_core.core()
        got = None
        if fast is not None:  # the same keys and search, in one compiled pass (None: keys not all 16 bytes)
            got = fast.chain_keys(piece_keys, piece_lens, root, checkpoints, self._d._d, block_size,
                                  xxhash.xxh3_128_intdigest)
        found, marks = self._keys(root, piece_keys, piece_lens, checkpoints, block_size) if got is None else got
        prefix: tuple[np.ndarray, ...]
        prefix, start, used = ((), 0, None) if found is None else (*found[2], found[1])
        parent = int(prefix[-1][-1]) if start else root
        if self.hasher is None:
            new = block_hashes(tokens[start * block_size:], block_size, parent)
        else:
            if start and not self.hasher.knows(parent):  # its full digest was let go: hash from block 0
                start, prefix, used, parent = 0, (), None, root
            new = self.hasher.hashes(tokens[start * block_size:], block_size, parent if start else None,
                                     start, keys)
        segs = [*prefix, new] if len(new) or not start else list(prefix)
        self.blocks_hashed += len(new)
        self.blocks_reused += start
        self._remember(segs, marks, used)
        return segs

    def _keys(self, root: int, piece_keys: list[bytes], piece_lens: list[int], checkpoints: list[int],
              block_size: int) -> tuple[tuple[int, int, Any] | None, list[tuple[int, int]]]:
        """Where to resume and what to remember: the longest remembered prefix (j, its key, its (parts,
        blocks)) whose block count still matches, each look-up a use; and (key, blocks) of each checkpoint.
        The reference the compiled `chain_keys` equals."""
        roll = _PrefixKeys(root, piece_keys)
        ends = list(accumulate(piece_lens))
        found = None
        for j in range(len(piece_keys) - 1, -1, -1):
            hit = self._d.get(key := roll(j))
            if hit is not None and hit[1] == ends[j] // block_size:
                found = (j, key, hit)
                break
        return found, [(roll(j), ends[j] // block_size) for j in checkpoints if 0 <= j < len(ends)]

    def _remember(self, segs: list[np.ndarray], marks: list[tuple[int, int]], used: int | None) -> None:
        """Keep this request's checkpoints (key, blocks); drop the one it resumed from unless it is one of
        them (a conversation's previous turn is superseded by this turn's longer history)."""
        keys = set()
        for key, n in marks:
            keys.add(key)
            known = self._d.get(key)
            if known is None or known[1] != n:
                self._d.put(key, (_cut(segs, n), n), n * 8 + 200)
        if used is not None and used not in keys:
            self._d.pop(used)


class _PrefixKeys:
    """j -> a 128-bit key of (root, piece_keys[:j + 1]): xxh3-128 over the root and the keys joined
    (each prefixed by its length unless all are 16 bytes, so the join stays unambiguous). A request
    needs only a few of these (the remembered one it resumes from, its checkpoints), not one per piece.
    With 16-byte keys, key j covers the join's first 24 + 16 j bytes (as the compiled `chain_keys`)."""

    def __init__(self, root: int, piece_keys: list[bytes]) -> None:
        head = root.to_bytes(8, "little")
        self.offs: list[int] | None = None
        if set(map(len, piece_keys)) <= {16}:  # every key 16 bytes (the tokenizers' keys): cuts at 16-byte steps
            data = head + b"".join(piece_keys)
        else:
            data = head + b"".join(len(k).to_bytes(4, "little") + k for k in piece_keys)
            self.offs = list(accumulate((4 + len(k) for k in piece_keys), initial=8))
        self.view = memoryview(data)

    def __call__(self, j: int) -> int:
        cut = 24 + 16 * j if self.offs is None else self.offs[j + 1]
        return xxhash.xxh3_128_intdigest(self.view[:cut])


def _cut(segs: list[np.ndarray], n: int) -> tuple[np.ndarray, ...]:
    """The first `n` hashes of consecutive parts, as read-only views (no copies)."""
    out = []
    for s in segs:
        if n <= 0:
            break
        if n >= len(s) and not s.flags.writeable:  # a remembered part whole: itself (already read-only)
            v = s
        else:
            v = s[:n]
            v.flags.writeable = False
        out.append(v)
        n -= len(v)
    return tuple(out)
