"""The capacity curve of a log taken as one chunk: `lru.capacity_curve` on its arrays in memory.

A log the pipeline takes as one chunk is held in memory anyway, so instead of spilling it as
`stream.CapacityStream` does, its chunks are kept as arrays and `finish` runs the in-memory kernels on them
(no spill read or written), which give the same table value for value (`tests/test_capacity_stream.py`).
Past `max_blocks` listed blocks it hands what it holds to a CapacityStream and streams from then on, so a
large log analysed as one chunk (not in time order, or with no run directory) stays bounded.
`take` is `finish` split in two (take the arrays now, compute later), which lets `analyze` compute the
curve in a background thread beside the aggregates and findings (docs/pipeline.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from prefixscan.reuse.capacity.lru import capacity_curve
from prefixscan.reuse.capacity.spill import check_chunk
from prefixscan.reuse.capacity.stream import CapacityStream

MAX_BLOCKS = 1 << 25  # 32M listed blocks (a 256 MiB Mooncake trace has ~20M): ~0.7 GiB of kernel input


class WholeCapacity:
    """`CapacityStream`'s interface (add, total_blocks, finish, close) over chunks kept in memory."""

    def __init__(self, block_size: int, rule: str, spill_dir: str, *, max_blocks: int = MAX_BLOCKS) -> None:
        self.block_size, self.rule, self.spill_dir, self.max_blocks = int(block_size), rule, spill_dir, max_blocks
        CapacityStream(block_size, rule, spill_dir).close()  # the same argument checks, at once
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._blocks = 0
        self._stream: CapacityStream | None = None
        self._done = False

    @property
    def total_blocks(self) -> int:
        return self._stream.total_blocks if self._stream is not None else self._blocks

    def add(self, offsets: np.ndarray, ids: np.ndarray, prompt_tokens: np.ndarray) -> None:
        """As `CapacityStream.add`: local CSR offsets, global dense int32 ids, prompt tokens per request."""
        if self._done:
            raise RuntimeError("WholeCapacity.add after finish() or close()")
        if self._stream is not None:
            self._stream.add(offsets, ids, prompt_tokens)
            return
        part = check_chunk(offsets, ids, prompt_tokens)
        self._parts.append(part)
        self._blocks += len(part[1])
        if self._blocks > self.max_blocks:  # too large to hold: stream from here on
            self._stream = CapacityStream(self.block_size, self.rule, self.spill_dir, defer_lru=True)
            parts, self._parts = self._parts, []
            while parts:
                self._stream.add(*parts.pop(0))

    @property
    def held(self) -> bool:
        """Whether the input is still held in memory (not handed to a stream, not finished): `take` works."""
        return self._stream is None and not self._done

    def finish(self, n_distinct: int, capacities_tokens: Sequence[int] | None = None, opt: bool = True,
               sample: float | None = None) -> pa.Table:
        """`CapacityStream.finish`'s table (the sampled one too, with `sample` below 1)."""
        if self._done:
            raise RuntimeError("WholeCapacity.finish called twice or after close()")
        if self._stream is None:
            return self.take(n_distinct, capacities_tokens, opt, sample)()
        try:
            return self._stream.finish(n_distinct, capacities_tokens, opt, sample)
        finally:
            self.close()

    def take(self, n_distinct: int, capacities_tokens: Sequence[int] | None = None, opt: bool = True,
             sample: float | None = None) -> Callable[[], pa.Table]:
        """`finish` in two steps, so that the curve can be computed in another thread: the held arrays are
        checked and taken now (this object is closed), and the function returned computes `finish`'s table
        from them alone (no file, nothing of this object), whenever and wherever it is called."""
        if not self.held:
            raise RuntimeError("WholeCapacity.take needs the input held in memory (not streamed, not finished)")
        try:
            offsets, ids, prompts = self._whole()
            if len(ids) and (n_distinct < 0 or int(ids.max()) >= n_distinct):
                raise ValueError(f"n_distinct={n_distinct} but block id {int(ids.max())} was fed")
        finally:
            self.close()
        n, block_size, rule = int(n_distinct), self.block_size, self.rule

        return lambda: capacity_curve(offsets, ids, prompts, block_size, rule, capacities_tokens, opt, ids=(ids, n),
                                      sample=sample)

    def _whole(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts, self._parts = self._parts, []
        lengths = np.concatenate([np.zeros(0, np.int64), *(np.diff(p[0]) for p in parts)])
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.concatenate([np.zeros(0, np.int32), *(p[1] for p in parts)])
        prompts = np.concatenate([np.zeros(0, np.int64), *(p[2] for p in parts)])
        return offsets, ids, prompts

    def close(self) -> None:
        """Drop what is held (and the stream's spills); idempotent."""
        self._done = True
        self._parts = []
        if self._stream is not None:
            self._stream.close()
