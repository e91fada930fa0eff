"""The one interface every routing policy implements, and the cluster state a router may look at.

A policy sees only what a real router could: its own knowledge view of each replica's cache (exact,
delayed or approximate, see `knowledge.py`), queue and load counters the replicas export, and the
serving-time model for its predictions. It returns a `Decision` naming the replica plus the fields of
the seed's routing log (candidates, predicted cached tokens, reason).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import xxhash

from prefixscan.errors import UsageError
from prefixscan.reuse.hitrule import block_tokens
from prefixscan.sim.timing import ServingModel

if TYPE_CHECKING:
    from prefixscan.sim.config import SimConfig


@dataclass(frozen=True)
class Decision:
    """Where a request goes and why; `candidates` are the replicas the policy ranked, best first."""

    replica: int
    candidates: tuple[int, ...]
    predicted_cached_tokens: int
    reason: str


@dataclass(slots=True, eq=False)
class Req:
    """The request as the router sees it (block ids, lengths, tenant, conversation key)."""

    i: int
    blocks: np.ndarray
    prompt_tokens: int
    output_tokens: int
    tenant: int
    conv_key: int
    arrival: float


class ClusterView:
    """Live per-replica counters (numpy arrays the engine updates in place) plus cache knowledge."""

    def __init__(self, n_slots: int, serving: ServingModel, knowledge: Any, workload: Any, capacity: int,
                 rng: np.random.Generator) -> None:
        self.n = n_slots
        self.serving = serving
        self.knowledge = knowledge
        self.workload = workload
        self.capacity = capacity
        self.rng = rng
        self.now = 0.0
        self.active = np.zeros(n_slots, dtype=bool)
        self.active_idx = np.zeros(0, dtype=np.int64)
        self.version = 0  # bumps whenever the active set changes (rings rebuild on it)
        self.inflight = np.zeros(n_slots, dtype=np.int64)  # routed, not finished
        self.waiting = np.zeros(n_slots, dtype=np.int64)  # routed, prefill not started
        self.decoding = np.zeros(n_slots, dtype=np.int64)
        self.load_blocks = np.zeros(n_slots, dtype=np.int64)  # blocks of in-flight requests
        self.inflight_output = np.zeros(n_slots, dtype=np.int64)  # output tokens of in-flight requests
        self.queued_prefill_s = np.zeros(n_slots, dtype=np.float64)
        self.lane_until = np.zeros(n_slots, dtype=np.float64)
        self.kv_available = np.full(n_slots, capacity, dtype=np.int64)
        self.queued_blocks = np.zeros(n_slots, dtype=np.int64)
        self._match_buf = np.zeros(n_slots, dtype=np.int64)
        self._match_for = -1
        self._rand = np.zeros(0)
        self._rand_i = 0

    def set_active(self, idx: np.ndarray) -> None:
        self.active[:] = False
        self.active[idx] = True
        self.active_idx = np.flatnonzero(self.active)
        self.version += 1

    def matched_blocks(self, req: Req) -> np.ndarray:
        """Leading blocks of `req` each replica holds, as far as this router knows (cached per request)."""
        if self._match_for != req.i:
            self.knowledge.match(req.blocks, self.now, self._match_buf)
            self._match_for = req.i
        return self._match_buf

    def cached_tokens(self, req: Req) -> np.ndarray:
        """Predicted cached tokens per replica under the engine's hit rule."""
        w = self.workload
        return block_tokens(self.matched_blocks(req), w.block_size, w.hit_cap[req.i])

    def cached_at(self, req: Req, r: int) -> int:
        """Predicted cached tokens on one replica (cheaper than the vector when a policy ignores caches)."""
        w = self.workload
        return block_tokens(int(self.matched_blocks(req)[r]), w.block_size, int(w.hit_cap[req.i]))

    def uniform(self) -> float:
        """The next number of the policy's seeded uniform stream (drawn 4096 at a time).

        Every random choice draws from this one stream, so the compiled replay, which precomputes the
        same stream, makes the same choices.
        """
        if self._rand_i >= len(self._rand):
            self._rand = self.rng.random(4096)
            self._rand_i = 0
        u = float(self._rand[self._rand_i])
        self._rand_i += 1
        return u

    def pick(self, candidates: np.ndarray) -> int:
        """A seeded uniform choice among candidates (ties), without rng.choice's per-call overhead."""
        if len(candidates) == 1:
            return int(candidates[0])
        return int(candidates[int(self.uniform() * len(candidates))])

    def backlog_s(self) -> np.ndarray:
        """Predicted seconds until a newly queued prefill could start, per replica."""
        return np.maximum(self.lane_until - self.now, 0.0) + self.queued_prefill_s

    def predicted_ttft(self, req: Req, cached: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(queue wait, TTFT) per replica from backlog + uncached prefill at the current decode load."""
        wait = self.backlog_s()
        new = req.prompt_tokens - cached
        return wait, wait + self.serving.prefill_s_vec(new, cached, self.decoding)

    def argmin_active(self, values: np.ndarray) -> int:
        """Lowest value among active replicas; ties go to the lowest id (deterministic)."""
        idx = self.active_idx
        return int(idx[np.argmin(values[idx])])

    def ranked(self, values: np.ndarray, k: int = 3) -> tuple[int, ...]:
        """Active replicas by ascending value (stable), first k: the decision log's candidates."""
        idx = self.active_idx
        order = np.argsort(values[idx], kind="stable")[:k]
        return tuple(int(x) for x in idx[order])


class Policy:
    """Base class: subclasses set `name`, a frozen `Params` dataclass and implement `choose`."""

    name: ClassVar[str] = "base"
    Params: ClassVar[type] = type(None)
    knowledge: ClassVar[str | None] = None  # None: the run's --knowledge

    def __init__(self, params: Any, seed: int) -> None:
        self.params = params
        self.seed = seed

    def view_options(self, block_size: int) -> dict[str, Any]:
        """Extra arguments for the knowledge view (TTL, size cap), from the policy's parameters (a size
        given in tokens becomes blocks of the replay's `block_size`)."""
        return {}

    def view(self, cfg: SimConfig, block_size: int) -> tuple[str, dict[str, Any]]:
        """(knowledge mode, `make_view` options) of this policy in a run with this config (both engines): the
        mode is the policy's `knowledge` parameter, else its class's, else the run's."""
        opts = {"delay_s": cfg.event_delay_s, "ttl_s": cfg.approx_ttl_s, **self.view_options(block_size)}
        return getattr(self.params, "knowledge", None) or self.knowledge or cfg.knowledge, opts

    def rng(self, seed: int) -> np.random.Generator:
        """The generator of the policy's uniform stream (`ClusterView.uniform`; the compiled replay draws
        the same numbers ahead): the run's seed and the policy's name."""
        return np.random.default_rng([seed, sum(map(ord, self.name))])

    def choose(self, req: Req, view: ClusterView) -> Decision:
        raise NotImplementedError


def coerce_params(cls: type, overrides: dict[str, Any], policy: str) -> Any:
    """Build a frozen Params dataclass from string/number overrides, with clear errors for typos."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key not in fields:
            raise UsageError(f"policy {policy} has no parameter {key!r}; it has: {', '.join(fields) or 'none'}")
        default = fields[key].default
        try:
            if isinstance(default, bool):
                kwargs[key] = raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
            elif isinstance(default, int):
                kwargs[key] = int(raw)
            elif isinstance(default, float):
                kwargs[key] = float(raw)
            elif default is None:
                kwargs[key] = None if str(raw).lower() in ("none", "") else float(raw)
            else:
                kwargs[key] = str(raw)
        except ValueError:
            raise UsageError(f"parameter {policy}.{key}: cannot read {raw!r} as {type(default).__name__}") from None
    return cls(**kwargs)


# A consistent-hash ring with virtual nodes, shared by session_affinity, chwbl and prefix_hash. Keys and
# replica points are xxh3-64 values, so the ring (and every decision) is deterministic. Removing a replica
# only moves the keys it owned; adding one takes ~1/n of the keys.
def key_hash(value: int, salt: int = 0) -> int:
    """Spread an integer key (conversation hash, block id) uniformly over the ring."""
    return xxhash.xxh3_64_intdigest(int(value).to_bytes(8, "little", signed=False), seed=salt)


class Ring:
    """Sorted virtual-node points; rebuilt when the active replica set changes."""

    def __init__(self, vnodes: int = 100, seed: int = 0) -> None:
        self.vnodes = max(1, vnodes)
        self.seed = seed
        self.version = -1
        self.points = np.zeros(0, dtype=np.uint64)
        self.owners = np.zeros(0, dtype=np.int64)
        self.n_replicas = 0

    def points_of(self, replicas: Iterable[int]) -> np.ndarray:
        """The virtual-node points of these replicas, replica by replica (the compiled ring sorts the same)."""
        return np.array([xxhash.xxh3_64_intdigest(f"replica-{int(r)}-vnode-{v}".encode(), seed=self.seed)
                         for r in replicas for v in range(self.vnodes)], dtype=np.uint64)

    def sync(self, active_idx: np.ndarray, version: int) -> None:
        if version == self.version:
            return
        pts = self.points_of(active_idx)
        order = np.argsort(pts, kind="stable")
        self.points = pts[order]
        self.owners = np.repeat(np.asarray(active_idx, dtype=np.int64), self.vnodes)[order]
        self.n_replicas = len(active_idx)
        self.version = version

    def walk(self, key: int) -> Iterator[int]:
        """Distinct replicas clockwise from the key's position."""
        m = len(self.points)
        pos = int(np.searchsorted(self.points, np.uint64(key), side="left"))
        seen: set[int] = set()
        for j in range(m):
            r = int(self.owners[(pos + j) % m])
            if r not in seen:
                seen.add(r)
                yield r
                if len(seen) == self.n_replicas:
                    return

    def owner(self, key: int) -> int:
        return next(self.walk(key))


def request_key(req, mode: str, prefix_blocks: int, block_keys: np.ndarray) -> int:
    """Routing key: the conversation (falling back to the prefix) or the first K blocks' chain hash.

    Block hashes chain, so the hash of block K-1 stands for the whole K-block prefix.
    """
    if mode == "conversation" and req.conv_key:
        return key_hash(req.conv_key, 1)
    nb = len(req.blocks)
    if nb == 0:
        return key_hash(req.i, 3)
    return key_hash(int(block_keys[req.blocks[min(prefix_blocks, nb) - 1]]), 2)
