"""A consistent-hash ring with virtual nodes, shared by session_affinity, chwbl and prefix_hash.

Keys and replica points are xxh3-64 values, so the ring (and every decision) is deterministic.
Removing a replica only moves the keys it owned; adding one takes ~1/n of the keys.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import xxhash


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

    def sync(self, active_idx: np.ndarray, version: int) -> None:
        if version == self.version:
            return
        pts, own = [], []
        for r in active_idx:
            for v in range(self.vnodes):
                pts.append(xxhash.xxh3_64_intdigest(f"replica-{int(r)}-vnode-{v}".encode(), seed=self.seed))
                own.append(int(r))
        order = np.argsort(np.array(pts, dtype=np.uint64), kind="stable")
        self.points = np.array(pts, dtype=np.uint64)[order]
        self.owners = np.array(own, dtype=np.int64)[order]
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
