"""`SqlIdealStream`: `IdealStream`'s interface over the reuse SQL, the query run per chunk over every chunk so
far (quadratic in the chunk count). The per-chunk proof that the SQL is the reuse stage (tests/test_reuse_sql.py);
the product reads the SQL's whole-log results instead (`distributed.reuse_stage.SqlIdealCursor`). The salts
stand for the scope keys (0: no scope), so the SQL's composite keys (salt, hash) are the scan's salted hashes
without the xor."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from prefixscan.reuse.ideal import NO_SCOPE, IdealResult
from prefixscan.reuse.sql import ideal_result, reuse_of_requests


def dense_ids(flat: np.ndarray) -> tuple[np.ndarray, int]:
    """Each block reference's id: the rank of its hash's first appearance (the scan's numbering)."""
    if not len(flat):
        return np.zeros(0, np.int32), 0
    _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse].astype(np.int32), len(first)


def _keys(salts: np.ndarray) -> pa.Array:
    s = np.asarray(salts, dtype=np.uint64)
    return pa.array(s, type=pa.uint64(), mask=s == NO_SCOPE)


class SqlIdealStream:
    """`IdealStream`'s interface over the reuse SQL. Each chunk's query runs over every chunk so far (the
    rows of earlier chunks are final already, so only the new chunk's rows are returned): exact, but the
    work grows with the square of the chunk count, so this is for a log taken as one chunk (which the
    reuse stage still feeds as two: what can be written, then what it held back)."""

    def __init__(self, memory_limit: str = "1GB", temp_directory: str | None = None,
                 threads: int | None = None) -> None:
        self.options = {"memory_limit": memory_limit, "temp_directory": temp_directory, "threads": threads}
        self.chunks: list[tuple[np.ndarray, ...]] = []
        self.n = 0
        self._distinct = 0

    @property
    def n_distinct(self) -> int:
        return self._distinct

    def release(self) -> None:
        """Drop the chunks kept for the next query."""
        self.chunks = []

    def add(self, offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray, block_size: int, rule: str,
            tenant_salts: np.ndarray, conversation_salts: np.ndarray) -> tuple[IdealResult, np.ndarray]:
        """The next chunk's IdealResult (`source` in whole-log indices) and whole-log dense ids."""
        off = np.asarray(offsets, dtype=np.int64)
        self.chunks.append((np.diff(off), np.ascontiguousarray(hashes[off[0]:off[-1]], dtype=np.uint64),
                            np.asarray(prompt_tokens, dtype=np.int64), np.asarray(tenant_salts, np.uint64),
                            np.asarray(conversation_salts, np.uint64)))
        lengths, flat, prompt, ten, conv = (np.concatenate(c) for c in zip(*self.chunks, strict=True))
        total = len(prompt)
        whole = np.zeros(total + 1, np.int64)
        np.cumsum(lengths, out=whole[1:])
        table = pa.table({
            "seq": pa.array(np.arange(total, dtype=np.int64)), "prompt_tokens": pa.array(prompt),
            "tenant": _keys(ten), "conversation_id": _keys(conv),
            "block_hashes": pa.LargeListArray.from_arrays(pa.array(whole), pa.array(flat, type=pa.uint64())),
        })
        res = ideal_result(reuse_of_requests(table, block_size, rule, **self.options), total)
        gid, self._distinct = dense_ids(flat)
        first, self.n = self.n, total
        part = IdealResult(**{f: getattr(res, f)[first:] for f in IdealResult.__dataclass_fields__})
        return part, gid[whole[first]:]
