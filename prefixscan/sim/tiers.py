"""KV tiers below the GPU: a host-memory tier per replica and an optional fleet-shared store.

The GPU pool stays vLLM's block pool (`kvcache.py`). A request's hit is its GPU prefix, then, block by
block, the next blocks from the fastest lower tier holding them (host of the chosen replica, then the
shared store); the first block no tier holds ends the hit. Loaded blocks get GPU slots like new blocks
(they are cached on the GPU again) and their bytes cross the tier's link before the prefill, so the load
time enters TTFT (`timing.load_s`).

Writes, as the engines do them:
- host, "through" (default): every block a request computes is copied to host memory (vLLM's
  OffloadingConnector stores computed blocks; SGLang HiCache `--hicache-write-policy write_through`);
  "back": a block is copied when the GPU evicts it (SGLang `write_back`);
- shared store: every computed block is written (LMCache remote / Mooncake store put), through one
  write link per store: a block becomes readable once its bytes have crossed it.
Each tier is an LRU of block ids with its own capacity; a hit or a rewrite refreshes a block. A replica
restart empties its host tier (process memory); the shared store survives.
The slow, obviously-correct model of `LRUTier` the property tests compare against is `tests/oracles/tiers_ref.py`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from prefixscan.errors import UsageError
from prefixscan.reuse.hitrule import block_tokens

if TYPE_CHECKING:
    from prefixscan.sim.config import SimConfig

TIERS = ("gpu", "host", "shared")


# The links KV blocks cross and how the host tier is written: the names the simulator's options take
# (`config.SimConfig` checks them; the tiers and the disaggregated fleet, `disagg`, use them). Named links
# in GB/s (1e9 bytes per second) per direction.
LINKS: dict[str, float] = {
    # PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b encoding = 63 GB/s per direction (PCI-SIG PCIe 5.0)
    "pcie5-x16": 63.0,
    # PCIe Gen4 x16: 16 GT/s x 16 lanes = 31.5 GB/s per direction (PCI-SIG PCIe 4.0)
    "pcie4-x16": 31.5,
    # one 400 Gb/s RDMA NIC per GPU (InfiniBand NDR / ConnectX-7 class, as in Mooncake's and NIXL's setups)
    "rdma-400g": 50.0,
    # 200 Gb/s RDMA NIC (HDR / ConnectX-6 class)
    "rdma-200g": 25.0,
    # NVLink 4 (H100): 450 GB/s per direction per GPU (NVIDIA H100 datasheet, 900 GB/s bidirectional)
    "nvlink4": 450.0,
}
HOST_WRITES = ("through", "back")


def link_gbs(value: str | float) -> float:
    """A link speed in GB/s from a name in LINKS or a number."""
    if isinstance(value, (int, float)):
        gbs = float(value)
    elif value in LINKS:
        gbs = LINKS[value]
    else:
        try:
            gbs = float(value)
        except ValueError:
            raise UsageError(f"link speed must be GB/s or one of {', '.join(LINKS)}, got {value!r}") from None
    if not gbs > 0:
        raise UsageError(f"link speed must be > 0 GB/s, got {value!r}")
    return gbs


class LRUTier:
    """A set of block ids with a capacity in blocks, least recently used evicted first (O(1) per op)."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity  # None: unbounded
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __contains__(self, b: int) -> bool:
        return b in self.lru

    def __len__(self) -> int:
        return len(self.lru)

    def touch(self, ids: list[int]) -> None:
        """Refresh held ids; a chain's head ends most recent (its tail is evicted first, as on the GPU)."""
        for b in reversed(ids):
            if b in self.lru:
                self.lru.move_to_end(b)

    def put(self, ids: list[int]) -> None:
        """Insert (or refresh) ids tail first; evict the least recent beyond capacity."""
        if self.capacity == 0:
            return
        lru = self.lru
        for b in reversed(ids):
            if b in lru:
                lru.move_to_end(b)
            else:
                lru[b] = None
                if self.capacity is not None and len(lru) > self.capacity:
                    lru.popitem(last=False)
                    self.evictions += 1

    def clear(self) -> None:
        self.lru.clear()


@dataclass(frozen=True)
class TierSpec:
    """Sizes (blocks; None = unbounded, 0 = off) and links of the lower tiers, resolved from a SimConfig."""

    host_blocks: int
    host_gbs: float
    host_write: str
    shared_blocks: int | None  # None: unbounded store; 0: no store
    shared_read_gbs: float
    shared_write_gbs: float
    shared_latency_s: float
    bytes_per_token: float
    block_size: int

    @property
    def bytes_per_block(self) -> float:
        return self.bytes_per_token * self.block_size


class TierState:
    """Host tiers of R replicas and the shared store, with the per-request lookup the engine calls."""

    def __init__(self, spec: TierSpec, replicas: int, n_requests: int = 0, make: type | None = None) -> None:
        """`make`: the tier class (default `LRUTier`, looked up at call time so tests can swap in the
        reference). Per-request results go to `host_tokens`, `shared_tokens` and `load_s`."""
        make = make or LRUTier
        self.spec = spec
        self.host_tokens = np.zeros(n_requests, np.int64)
        self.shared_tokens = np.zeros(n_requests, np.int64)
        self.load = np.zeros(n_requests)
        host = None if spec.host_blocks < 0 else spec.host_blocks
        self.host = [make(host) for _ in range(replicas)]
        self.shared = make(spec.shared_blocks) if spec.shared_blocks != 0 else None
        self.ready: dict[int, float] = {}  # shared store: when a block's write completes
        self.write_free_s = 0.0  # the store's write link is busy until then

    def extend(self, r: int, blocks: np.ndarray, k: int, limit: int, now: float) -> tuple[int, int]:
        """Blocks k.. of `blocks` (up to `limit`) that lower tiers hold, each from the fastest holding it:
        returns (from host, from shared). The hit ends at the first block no tier holds."""
        host, shared, ready = self.host[r], self.shared, self.ready
        nh = ns = 0
        for j in range(k, limit):
            b = int(blocks[j])
            if b in host:
                nh += 1
            elif shared is not None and b in shared and ready[b] <= now:
                ns += 1
            else:
                break
        return nh, ns

    def admitted(
        self, i: int, r: int, blocks: np.ndarray, k: int, nh: int, ns: int, cap: int, evicted: np.ndarray,
        now: float,
    ) -> tuple[int, float]:
        """Request i was admitted on r with GPU hit k and lower-tier hits (nh, ns): update the tiers and
        record its tokens by tier; returns (cached tokens, load seconds)."""
        B = self.spec.block_size
        self.on_gpu_evict(r, evicted)
        self.on_hit(r, blocks, k, nh + ns)
        self.on_compute(r, blocks[k + nh :], now)
        gpu = block_tokens(k, B, cap)
        host = block_tokens(k + nh, B, cap) - gpu
        total = block_tokens(k + nh + ns, B, cap)
        shared = total - gpu - host
        load = self.load_s(host, shared)
        self.host_tokens[i], self.shared_tokens[i], self.load[i] = host, shared, load
        return total, load

    def outcome(self) -> dict:
        """Per-request arrays and counters for `Outcome.tiers`."""
        return {"host_tokens": self.host_tokens, "shared_tokens": self.shared_tokens, "load_s": self.load,
                "host_evictions": sum(h.evictions for h in self.host),
                "shared_evictions": self.shared.evictions if self.shared is not None else 0,
                "host_blocks_per_replica": self.spec.host_blocks, "shared_blocks": self.spec.shared_blocks}

    def on_hit(self, r: int, blocks: np.ndarray, k: int, n: int) -> None:
        """Loaded blocks k..k+n are recently used wherever they are held."""
        ids = blocks[k : k + n].tolist()
        self.host[r].touch(ids)
        if self.shared is not None:
            self.shared.touch(ids)

    def on_compute(self, r: int, ids: np.ndarray, now: float) -> None:
        """Blocks a request computed (new full blocks at admission): write-through copies."""
        if not len(ids):
            return
        lst = ids.tolist()
        if self.spec.host_write == "through":
            self.host[r].put(lst)
        if self.shared is not None:
            fresh = [b for b in lst if b not in self.shared]
            if fresh:
                secs = len(fresh) * self.spec.bytes_per_block / (self.spec.shared_write_gbs * 1e9)
                self.write_free_s = max(self.write_free_s, now) + secs
                for b in fresh:
                    self.ready[b] = self.write_free_s
            self.shared.put(lst)

    def on_gpu_evict(self, r: int, ids: np.ndarray) -> None:
        """Write-back: blocks the GPU evicted are copied to host memory."""
        if self.spec.host_write == "back" and len(ids):
            self.host[r].put(ids.tolist())

    def on_restart(self, r: int) -> None:
        self.host[r].clear()

    def load_s(self, host_tokens: int, shared_tokens: int) -> float:
        """Seconds to bring a hit's lower-tier tokens onto the GPU (host link, then the store's)."""
        from prefixscan.sim.timing import load_s

        bpt = self.spec.bytes_per_token
        t = load_s(host_tokens, bpt, self.spec.host_gbs, 0.0)
        return t + load_s(shared_tokens, bpt, self.spec.shared_read_gbs, self.spec.shared_latency_s)


def _blocks(n_blocks: int, gib: float, bytes_per_block: float) -> int | None:
    """A tier size in blocks from --*-kv-blocks (-1: unbounded) or --*-kv-gib."""
    if n_blocks == -1:
        return None
    if n_blocks:
        return n_blocks
    return int(gib * 2**30 // bytes_per_block) if gib else 0


def make_tiers(cfg: SimConfig, block_size: int, replicas: int, n_requests: int) -> TierState | None:
    """The lower tiers of a replay, as the config asks for them (None: GPU only). Bytes per token come from
    the model catalogue: capacity counts the replica's whole KV, load time one GPU's share over that GPU's
    own link."""
    if not cfg.tiered:
        return None
    from prefixscan.sim.timing import kv_bytes_per_token

    full = kv_bytes_per_token(cfg.model, cfg.dtype, 1)
    host = _blocks(cfg.host_kv_blocks, cfg.host_kv_gib, full * block_size)
    shared = _blocks(cfg.shared_kv_blocks, cfg.shared_kv_gib, full * block_size)
    spec = TierSpec(
        host_blocks=-1 if host is None else host,
        host_gbs=link_gbs(cfg.host_link),
        host_write=cfg.host_write,
        shared_blocks=shared,
        shared_read_gbs=link_gbs(cfg.shared_read),
        shared_write_gbs=link_gbs(cfg.shared_write),
        shared_latency_s=cfg.shared_latency_s,
        bytes_per_token=full / max(cfg.tensor_parallel, 1),
        block_size=block_size,
    )
    return TierState(spec, replicas, n_requests)
