"""vLLM's own block hash values (`--hash vllm:ALGO`), so a run's hashes join an engine's KV events.

What vLLM 0.32.0 computes (vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py, vllm/config/cache.py):
- block i's hash is fn((parent digest or NONE_HASH, tuple(token ids of block i), extra_keys)), over full
  blocks only; extra_keys is a tuple, or None when the block has none (pickle and CBOR encode them
  differently, so the difference matters);
- fn is one of sha256 (pickle, protocol HIGHEST), sha256_cbor (cbor2 canonical), xxhash (xxh3-128 of the
  pickle), xxhash_cbor; digests are bytes (32 or 16);
- NONE_HASH = fn(seed string): PYTHONHASHSEED when set; else "vllm-none-hash" for the sha256 algorithms and
  32 random bytes (hex) per process for the xxhash ones, which no log can reproduce;
- extra keys, tagged, in this order: ("lora", name, path) on every block of a LoRA request;
  ("mm", identifier, offset - block start) per multimodal item overlapping the block;
  ("cache_salt", salt) on the block starting at token 0 when the salt is non-empty.
KV events carry `int.from_bytes(digest, "big") & (2**64 - 1)` (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES),
which is what the requests table stores. tests/data/vllm_hash_vectors.json pins values computed by vLLM.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import xxhash

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.hashing import BytesLRU
from prefixscan.errors import UsageError

VLLM_VERSION = "0.32.0"
VLLM_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
HASH_CHOICES = ("xxh3",) + tuple(f"vllm:{a}" for a in VLLM_ALGOS)
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # vLLM's seed for the sha256 algorithms without PYTHONHASHSEED
NON_CRYPTO = ("xxhash", "xxhash_cbor")
DIGEST_MEMO_BYTES = 64 << 20  # low-64 value -> full digest, so a resumed chain finds its parent
DIGEST_ENTRY = 230  # bytes a remembered digest costs besides its own (int key, LRU links, bytes header; measured)
MASK64 = (1 << 64) - 1


def _pickle(x: Any) -> bytes:
    return pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(x: Any) -> bytes:
    import cbor2

    return cbor2.dumps(x, canonical=True)


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """vLLM's `get_hash_fn_by_name(algo)`: object -> digest bytes."""
    if algo == "sha256":
        return lambda x: hashlib.sha256(_pickle(x)).digest()
    if algo == "sha256_cbor":
        return lambda x: hashlib.sha256(_cbor(x)).digest()
    if algo == "xxhash":
        return lambda x: xxhash.xxh3_128_digest(_pickle(x))
    if algo == "xxhash_cbor":
        return lambda x: xxhash.xxh3_128_digest(_cbor(x))
    raise UsageError(f"unknown vLLM hash algorithm {algo!r}; expected one of {', '.join(VLLM_ALGOS)}")


def low64(digest: bytes) -> int:
    """The form vLLM's KV events carry with integer block hashes: low 64 bits, big-endian."""
    return int.from_bytes(digest, "big") & MASK64


def parse_hash(spec: str, seed: str | None) -> tuple[str, str | None]:
    """Check `--hash` / `--hash-seed`: (algorithm or "xxh3", the seed NONE_HASH is derived from)."""
    if spec == "xxh3":  # a seed (from prefixscan.toml, say, under a --hash xxh3 flag) does not apply
        return "xxh3", None
    if spec not in HASH_CHOICES:
        raise UsageError(f"--hash {spec!r} is not known; expected one of {', '.join(HASH_CHOICES)}")
    algo = spec.split(":", 1)[1]
    if seed is None and algo in NON_CRYPTO:
        raise UsageError(f"--hash {spec} needs --hash-seed: without PYTHONHASHSEED vLLM {VLLM_VERSION} derives "
                         "NONE_HASH for xxhash from os.urandom, so only an engine started with PYTHONHASHSEED=SEED "
                         "has reproducible hashes; pass the same SEED")
    return algo, seed if seed is not None else DEFAULT_NONE_HASH_SEED


@dataclass(frozen=True, slots=True)
class MediaSpan:
    """A multimodal item's placeholder tokens in the prompt, as vLLM's PlaceholderRange, and its id."""

    identifier: str
    offset: int
    length: int


def extra_keys(start: int, end: int, lora: tuple[str, str] | None, salt: str | None,
               mm: Sequence[MediaSpan] = (), mm_idx: int = 0) -> tuple[tuple[Any, ...] | None, int]:
    """vLLM's `generate_block_hash_extra_keys` for the block [start, end): (keys or None, next mm index)."""
    mm_keys: list[Any] = []
    i = mm_idx
    while i < len(mm):
        it = mm[i]
        if end <= it.offset:
            break
        if start >= it.offset + it.length:
            i += 1
            continue
        mm_keys.append(("mm", it.identifier, it.offset - start))
        if end >= it.offset + it.length:
            i += 1
        else:
            break
    keys: list[Any] = [("lora", lora[0], lora[1])] if lora else []
    keys += mm_keys
    if start == 0 and salt:
        keys.append(("cache_salt", salt))
    return (tuple(keys) if keys else None), i


@dataclass(frozen=True, slots=True)
class RequestKeys:
    """What a request adds to its blocks' extra keys: LoRA (name, path), cache_salt, media spans."""

    lora: tuple[str, str] | None = None
    salt: str | None = None
    mm: tuple[MediaSpan, ...] = ()


NO_KEYS = RequestKeys()


@dataclass
class VllmHasher:
    """Block digests exactly as one vLLM engine with this algorithm and seed computes them.

    Digests are remembered by their low 64 bits (bounded), so `hashing.ChainCache` can resume a chain
    from a stored uint64 value; a parent it no longer holds makes the caller hash from block 0.
    """

    algo: str
    seed: str
    fn: Callable[[Any], bytes] = field(init=False)
    none_hash: bytes = field(init=False)
    blocks: int = 0

    def __post_init__(self) -> None:
        self.fn = hash_function(self.algo)
        self.none_hash = self.fn(self.seed)
        self.digest_memo = BytesLRU(DIGEST_MEMO_BYTES)

    def knows(self, parent: int) -> bool:
        return self.digest_memo.get(parent) is not None

    def digests(self, tokens: np.ndarray, block_size: int, parent: bytes | None = None, first_block: int = 0,
                keys: RequestKeys | None = None) -> list[bytes]:
        """Digests of the full blocks of `tokens`, which start at block `first_block` of the prompt."""
        k = keys or NO_KEYS
        ids = np.asarray(tokens).tolist()  # Python ints: pickle and CBOR encode numpy scalars differently
        out = []
        mm_idx = 0
        later = extra_keys(block_size, 2 * block_size, k.lora, k.salt)[0]  # every block after 0, without media
        fn = self.fn
        for b in range(len(ids) // block_size):
            start = (first_block + b) * block_size
            if k.mm or start == 0:
                extra, mm_idx = extra_keys(start, start + block_size, k.lora, k.salt, k.mm, mm_idx)
            else:
                extra = later
            parent = fn((parent or self.none_hash, tuple(ids[b * block_size:(b + 1) * block_size]), extra))
            out.append(parent)
        self.blocks += len(out)
        return out

    def hashes(self, tokens: np.ndarray, block_size: int, parent: int | None = None, first_block: int = 0,
               keys: RequestKeys | None = None) -> np.ndarray:
        """Low-64 values (uint64) of `digests`; `parent` is the stored value of the block before."""
        p = None if parent is None else self.digest_memo.get(parent)
        if parent is not None and p is None:
            raise KeyError(parent)
        ds = self.digests(tokens, block_size, p, first_block, keys)
        out = np.fromiter((low64(d) for d in ds), dtype=np.uint64, count=len(ds))
        for v, d in zip(out.tolist(), ds, strict=True):
            self.digest_memo.put(v, d, len(d) + DIGEST_ENTRY)
        return out


def check_hash_options(cfg: AnalyzeConfig) -> None:
    """Refuse option sets that cannot give vLLM's values (one-line errors before any work)."""
    algo, _ = parse_hash(cfg.hash, cfg.hash_seed)
    if algo == "xxh3":
        return
    if cfg.isolate_tenants:
        raise UsageError("--isolate-tenants salts prefixscan's own chain; with --hash vllm:* the chain is vLLM's, "
                         "where tenants are isolated by a per-tenant cache_salt in the log")
    if cfg.granularity != "block":
        raise UsageError("--hash vllm:* hashes vLLM's full blocks; it needs --granularity block")


def hash_description(cfg: AnalyzeConfig) -> dict[str, Any]:
    """What the summary and manifest say about the block hash values in the requests table."""
    algo, seed = parse_hash(cfg.hash, cfg.hash_seed)
    if algo == "xxh3":
        return {"algorithm": "xxh3", "values": "prefixscan chain (xxh3-64 over parent + uint32 ids)"}
    return {"algorithm": f"vllm:{algo}", "vllm_version": VLLM_VERSION, "seed": seed,
            "seed_source": "--hash-seed" if cfg.hash_seed is not None else f"vLLM default {seed!r}",
            "values": "low 64 bits of the digest, big-endian (vLLM KV events with integer block hashes)"}


def hasher_for(cfg: AnalyzeConfig) -> VllmHasher | None:
    """A hasher for this run's `--hash` (each chain cache its own, freed with the run), or None for
    prefixscan's own chain."""
    algo, seed = parse_hash(cfg.hash, cfg.hash_seed)
    return None if algo == "xxh3" or seed is None else VllmHasher(algo, seed)


def request_keys(lora_paths: dict[str, str], adapter: str | None, salt: str | None,
                 mm: tuple[MediaSpan, ...] = ()) -> RequestKeys:
    """A record's extra-key inputs. vLLM keys a LoRA by (name, path); a name without a --lora-path
    keeps its name as the path, so those blocks cannot equal the engine's (counted, docs/analyze.md)."""
    if not adapter:
        return RequestKeys(None, salt or None, mm)
    name, path = _lora_fields(adapter)
    return RequestKeys((name, lora_paths.get(name, path or name)), salt or None, mm)


def _lora_fields(adapter: str) -> tuple[str, str | None]:
    """(name, path) of a logged adapter: a bare name, or a `lora_request` object the reader kept as JSON."""
    if adapter.startswith("{"):
        try:
            d = orjson.loads(adapter)
        except orjson.JSONDecodeError:
            return adapter, None
        name = d.get("lora_name") or d.get("name")
        if isinstance(name, str):
            path = d.get("lora_path") or d.get("path")
            return name, path if isinstance(path, str) else None
    return adapter, None


def has_lora_path(lora_paths: dict[str, str], adapter: str) -> bool:
    """Whether vLLM's ("lora", name, path) key of this adapter is known (from --lora-path or the log)."""
    name, path = _lora_fields(adapter)
    return path is not None or name in lora_paths
