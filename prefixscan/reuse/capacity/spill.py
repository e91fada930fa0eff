"""The streamed capacity curve's spill files and chunk plan (`stream.CapacityStream`).

The stream keeps per-listed-block data on disk, not in memory: it appends each chunk's block ids to a
spill file and later reads runs of whole requests back into reused buffers. Here is that plumbing: the
check of a fed chunk, the plan that cuts the requests into runs of about a fixed number of blocks, and
reads and writes of whole arrays with `readinto`/`write` (no memory map: mapped pages would count in the RSS).
"""

from __future__ import annotations

from io import FileIO
from typing import BinaryIO, NamedTuple

import numpy as np

_INT32_MAX = np.iinfo(np.int32).max


class Chunk(NamedTuple):
    """A run of whole requests: requests r0..r1-1, listed blocks b0..b1-1 of the concatenated stream."""

    r0: int
    r1: int
    b0: int
    b1: int


def check_chunk(offsets: np.ndarray, ids: np.ndarray,
                 prompt_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate one chunk and return (int64 offsets, int32 ids, int64 prompt tokens)."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    ids = np.asarray(ids)
    prompts = np.ascontiguousarray(prompt_tokens, dtype=np.int64)
    if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must be non-decreasing CSR offsets starting at 0 (local to the chunk)")
    if ids.ndim != 1 or len(ids) != offsets[-1]:
        raise ValueError(f"offsets end at {offsets[-1]} but the chunk has {len(ids)} block ids")
    if prompts.ndim != 1 or len(prompts) != len(offsets) - 1:
        raise ValueError(f"{len(prompts)} prompt lengths for {len(offsets) - 1} requests")
    if len(ids) and (not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 or ids.max() > _INT32_MAX):
        raise ValueError("block ids must be non-negative int32 dense ids")
    return offsets, np.ascontiguousarray(ids, dtype=np.int32), prompts


def key_width(lengths: np.ndarray) -> tuple[int, int]:
    """The next-use key's width (most listed blocks of a request + 1) and its "never used again" value."""
    width = int(lengths.max()) + 1
    return width, len(lengths) * width


def plan_chunks(lengths: np.ndarray, chunk_blocks: int) -> list[Chunk]:
    """Cut the requests into runs of about `chunk_blocks` listed blocks (a longer request is a run alone)."""
    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    total = int(starts[-1])
    cuts = np.searchsorted(starts, np.arange(0, total, chunk_blocks, dtype=np.int64), side="right") - 1
    cuts = np.unique(np.concatenate([[0], cuts, [len(lengths)]]))
    return [Chunk(int(a), int(b), int(starts[a]), int(starts[b])) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def local_offsets(lengths: np.ndarray, c: Chunk) -> np.ndarray:
    """Offsets of run `c`'s requests, local to the run (starting at 0)."""
    out = np.zeros(c.r1 - c.r0 + 1, np.int64)
    np.cumsum(lengths[c.r0 : c.r1], out=out[1:])
    return out


def read_at(f: FileIO, item: int, out: np.ndarray) -> np.ndarray:
    """Fill `out` from the file's items starting at index `item` (a reused buffer; no memory map)."""
    f.seek(item * out.itemsize)
    view = memoryview(out).cast("B")  # type: ignore[arg-type]  # numpy types the buffer protocol on 3.12+
    got = 0
    while got < len(view):
        k = f.readinto(view[got:])
        if not k:
            raise OSError(f"spill file {f.name!r} ended early")
        got += k
    return out


def write_all(f: BinaryIO, arr: np.ndarray) -> None:
    """Write the whole array (a short write is retried)."""
    view = memoryview(arr).cast("B")  # type: ignore[arg-type]  # as in read_at
    done = 0
    while done < len(view):
        done += f.write(view[done:])
