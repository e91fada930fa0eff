"""Hashed-trace requests accumulated as arrays, with no Python object per request.

A trace of millions of requests carries only numbers for almost every line, so the accepted requests are
kept as numpy chunks (timestamps, lengths, namespaced block ids). String fields (request id, tenant,
conversation, ...) exist only on lines the ordinary path parsed; a string column becomes a Python list
the first time one of them carries a value, and stays None (all null) otherwise.
"""

from __future__ import annotations

from itertools import groupby
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from prefixscan.read.record import STRING_FIELDS, Record

if TYPE_CHECKING:  # polars is imported where a frame is built: a text log's encode stage never needs it
    import polars as pl

STRING_COLS = ("request_id", *STRING_FIELDS)
INT_COLS = ("turn_index", "output_tokens", "actual_cached_tokens")  # nullable: -1 stands for null
NUM_DTYPES = {"file": np.int32, "line": np.int64, "ts": np.float64, "prompt": np.int64, "root": np.uint64,
              "len": np.int64, **dict.fromkeys(INT_COLS, np.int64)}


def _nulls(name: str, dtype: Any, n: int) -> pl.Series:
    import polars as pl

    return pl.Series(name, [], dtype=dtype).extend_constant(None, n)


class TraceColumns:
    """Accepted hashed-trace requests in input order."""

    def __init__(self) -> None:
        self.files: list[str] = []
        self._file_idx: dict[str, int] = {}
        self.n = 0
        self._num: dict[str, list[np.ndarray | tuple[int, int]]] = {k: [] for k in NUM_DTYPES}  # (value, count)
        self._flat: list[np.ndarray] = []
        self._str: dict[str, list[Any] | None] = dict.fromkeys(STRING_COLS)

    def _file(self, path: str) -> int:
        i = self._file_idx.get(path)
        if i is None:
            i = self._file_idx[path] = len(self.files)
            self.files.append(path)
        return i

    def add(self, path: str, line: np.ndarray, ts_s: np.ndarray, prompt: np.ndarray, roots: np.ndarray | np.uint64,
            lengths: np.ndarray, flat: np.ndarray, ints: dict[str, np.ndarray] | None = None,
            strings: dict[str, list[Any]] | None = None) -> None:
        """Append requests of one file in input order; `flat` holds their namespaced block hashes."""
        k = len(line)
        if k == 0:
            return
        num = self._num
        # Columns constant over the call (file, a single root, absent fields) are kept as (value, count):
        # a 10M-request trace would otherwise hold 8 bytes per request of each twice over.
        num["file"].append((self._file(path), k))
        num["line"].append(np.asarray(line, dtype=np.int64))
        num["ts"].append(np.asarray(ts_s, dtype=np.float64))
        num["prompt"].append(np.asarray(prompt, dtype=np.int64))
        r = np.asarray(roots, dtype=np.uint64)
        num["root"].append((int(r), k) if r.ndim == 0 else r)
        num["len"].append(np.asarray(lengths, dtype=np.int64))
        for c in INT_COLS:
            v = (ints or {}).get(c)
            num[c].append((-1, k) if v is None else np.asarray(v, dtype=np.int64))
        self._flat.append(np.asarray(flat, dtype=np.uint64))
        for c in STRING_COLS:
            vals = (strings or {}).get(c)
            col = self._str[c]
            if vals is not None and any(v is not None for v in vals):
                if col is None:
                    col = self._str[c] = [None] * self.n
                col.extend(vals)
            elif col is not None:
                col.extend([None] * k)
        self.n += k

    def add_records(self, recs: list[Record], roots: np.ndarray, flat: np.ndarray) -> None:
        """Append records the ordinary path parsed, in order: a root per record and their namespaced block
        ids concatenated (`flat`)."""
        lengths = np.array([0 if r.hash_ids is None else len(r.hash_ids) for r in recs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        start = 0
        for path, run in groupby(recs, key=lambda r: r.source_file):  # one call per run of one file's records
            part = list(run)
            end = start + len(part)
            self.add(
                path,
                line=np.array([r.source_line for r in part], dtype=np.int64),
                ts_s=np.array([r.timestamp_s for r in part], dtype=np.float64),
                prompt=np.array([int(r.input_length or 0) for r in part], dtype=np.int64),
                roots=roots[start:end],
                lengths=lengths[start:end],
                flat=flat[offsets[start]:offsets[end]],
                ints={c: np.array([-1 if getattr(r, c) is None else getattr(r, c) for r in part]) for c in INT_COLS},
                strings={c: [getattr(r, c) for r in part] for c in STRING_COLS},
            )
            start = end

    def finish(self) -> tuple[pl.DataFrame, np.ndarray, np.ndarray]:
        """(per-request frame with the ingest columns, CSR offsets, namespaced block hashes)."""
        import polars as pl

        n = self.n

        def cat(name: str) -> np.ndarray:
            """One column, its parts released as it is built."""
            parts, self._num[name] = self._num[name], []
            out = np.empty(sum(len(p) if isinstance(p, np.ndarray) else p[1] for p in parts),
                           dtype=NUM_DTYPES[name])
            at = 0
            while parts:
                p = parts.pop(0)
                m = len(p) if isinstance(p, np.ndarray) else p[1]
                out[at:at + m] = p if isinstance(p, np.ndarray) else p[0]
                at += m
            return out

        lengths = cat("len")
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate(self._flat) if self._flat else np.zeros(0, np.uint64)
        self._flat = []
        file_idx = cat("file")
        line = cat("line")
        # Slow-path lines of a fast file were appended after their chunk's fast lines: restore input order
        # (files in the order read, lines within a file), permuting blocks and columns together.
        perm = None
        if n > 1 and not bool(((file_idx[1:] > file_idx[:-1]) | ((file_idx[1:] == file_idx[:-1])
                                                                  & (line[1:] > line[:-1]))).all()):
            perm = np.lexsort((line, file_idx))
            offsets, flat = permute_csr(offsets, flat, perm)
            file_idx, line = file_idx[perm], line[perm]
            for k in self._num:
                if k not in ("len", "file", "line") and self._num[k]:
                    self._num[k] = [cat(k)[perm]]
            for c in STRING_COLS:
                if self._str[c] is not None:
                    col = cast("list[Any]", self._str[c])
                    self._str[c] = [col[i] for i in perm]
        files = pl.Series("f", self.files, dtype=pl.String)
        source_file = files.gather(pl.Series(file_idx)) if n else pl.Series("f", [], dtype=pl.String)
        cols: dict[str, Any] = {
            "source_file": source_file.alias("source_file"),
            "source_line": pl.Series("source_line", line),
            "timestamp_s": pl.Series("timestamp_s", cat("ts")),
            "prompt_tokens": pl.Series("prompt_tokens", cat("prompt")),
            "head_tokens": _nulls("head_tokens", pl.Int64, n),
            "namespace": pl.Series("namespace", cat("root")),
        }
        for c in INT_COLS:
            dtype = pl.Int32 if c == "turn_index" else pl.Int64
            if all(isinstance(p, tuple) for p in self._num[c]):  # absent everywhere: all null
                self._num[c] = []
                cols[c] = _nulls(c, dtype, n)
                continue
            v = pl.Series(c, cat(c))
            cols[c] = v.set(v == -1, None).cast(dtype)
        for c in STRING_COLS:
            vals = self._str[c]
            cols[c] = pl.Series(c, vals, dtype=pl.String) if vals is not None else _nulls(c, pl.String, n)
        # a trace line without an explicit id is named by where it is: file:line
        implicit = (cols["source_file"] + ":" + cols["source_line"].cast(pl.String)).alias("request_id")
        cols["request_id"] = cols["request_id"].fill_null(implicit) if n else cols["request_id"]
        frame = pl.DataFrame(list(cols.values()))
        self._num = {k: [] for k in self._num}
        return frame, offsets, flat


def permute_csr(offsets: np.ndarray, flat: np.ndarray, perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a CSR list array (offsets, flat) in the order `perm`."""
    lengths = np.diff(offsets)[perm]
    new_off = np.zeros(len(perm) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_off[1:])
    src = np.repeat(offsets[:-1][perm] - new_off[:-1], lengths) + np.arange(new_off[-1], dtype=np.int64)
    return new_off, flat[src]
