"""Reuse stage: Batches -> requests rows with their ideal-cache columns, chunk by chunk, in analysis order.

Ideal reuse is causal (a request's hit depends only on earlier requests), so each chunk's rows are final
once the chunks before it are in: `IdealStream` carries the per-scope state (the whole log's dense ids and
last request per distinct block; the blocks each tenant and conversation scope has seen), rows go to the
write stage's `RowGroups`, the capacity curve's per-block input is spilled to disk (`CapacityStream`), and
the per-request columns the aggregates need later are spilled too. Memory grows with distinct blocks and a
few bytes per request, not with total tokens. A log taken as one chunk goes through the same code.

Analysis order is time, then input order. Chunks arrive in input order; a chunk is held back until the
next arrives, so disorder within one chunk's reach is sorted out. A request older than one already written
raises `OutOfOrder`, and `run` then analyses the log again as one chunk (a one-chunk log fed as it came:
`reuse_feed` feeds the Batches it kept to a fresh stream as one).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa

from prefixscan import memory
from prefixscan.config import AnalyzeConfig
from prefixscan.encode.hashing import counted_hit_blocks
from prefixscan.errors import UsageError
from prefixscan.pipeline.config import OutOfOrder
from prefixscan.pipeline.encode import Batch
from prefixscan.pipeline.frame import input_frame, requests_arrow
from prefixscan.pipeline.write import RowGroups
from prefixscan.read.trace_columns import permute_csr
from prefixscan.reuse.hitrule import hit_tokens_array
from prefixscan.reuse.ideal import IdealResult, IdealStream, TokenPrefixIndex, scope_salts

if TYPE_CHECKING:
    from prefixscan.reuse.sql import SqlIdealCursor


class _RequestIds:
    """Request ids of the rows written so far, for `source_request_id` (the source may be in any earlier
    chunk). A chunk whose ids are all the implicit `file:line` keeps only file codes and line numbers."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.parts: list[Any] = []
        self.files: list[str] = []
        self._file_code: dict[str, int] = {}

    def add(self, start: int, inp: pl.DataFrame) -> None:
        rid, src, line = inp["request_id"], inp["source_file"], inp["source_line"]
        implicit = bool(((src + ":" + line.cast(pl.String)) == rid).all())
        if implicit:
            for f in src.unique(maintain_order=True).to_list():
                if f not in self._file_code:
                    self._file_code[f] = len(self.files)
                    self.files.append(f)
            codes = src.replace_strict(self._file_code, return_dtype=pl.Int32).to_numpy()
            lines = line.to_numpy()
            self.parts.append((codes, lines.astype(np.int32) if lines.max() < 2**31 else lines.copy()))
        else:
            self.parts.append(rid.to_arrow())
        self.starts.append(start)

    def lookup(self, source: np.ndarray) -> pl.Series:
        """The id of each source request (null where the source is -1)."""
        out = pl.repeat(None, len(source), dtype=pl.String, eager=True).alias("source_request_id")
        has = np.nonzero(source >= 0)[0]
        if not len(has):
            return out
        part_of = np.searchsorted(np.asarray(self.starts), source[has], side="right") - 1
        files = pl.Series(self.files, dtype=pl.String)
        for p in np.unique(part_of).tolist():
            sel = has[part_of == p]
            local = source[sel] - self.starts[p]
            part = self.parts[p]
            if isinstance(part, tuple):
                codes, line = part
                vals = files.gather(codes[local]) + ":" + pl.Series(line[local]).cast(pl.String)
            else:
                vals = pl.Series(part.take(pa.array(local)), dtype=pl.String)
            out = out.scatter(sel, vals)
        return out


class RequestStream:
    """Consumes ingest Batches in input order and writes the requests table in analysis order."""

    def __init__(self, cfg: AnalyzeConfig, path: Path, spill_dir: str, one_chunk: bool = False) -> None:
        self.cfg = cfg
        self.one_chunk = one_chunk  # the log comes as one chunk: its capacity input is held in memory
        self.out = RowGroups(path, path.parent / "requests.parquet")
        self.spill_dir = spill_dir
        # the hook of --reuse sql (pipeline/reuse_sql_stream.py)
        self.ideal: IdealStream | SqlIdealCursor = IdealStream()
        self.reuse_info: dict[str, Any] = {"engine": "scan"}  # which reuse engine ran, for the summary
        self.ids = _RequestIds()
        self.capacity: Any = None
        self.block: int = None  # type: ignore[assignment]  # set by the first batch (`feed`)
        self.rule: str = None  # type: ignore[assignment]  # likewise
        self.pending: tuple[pl.DataFrame, np.ndarray, np.ndarray, list[str]] | None = None
        self.written_max_ts = -np.inf
        self.seq = 0
        self.ts0 = 0.0
        self.turns: dict[str, int] = {}
        # Per request, read back by the aggregates only: kept on disk while the per-block state is alive.
        self.source = _Spill(spill_dir, "source", np.int64)
        self.deepest = _Spill(spill_dir, "deepest", np.uint64)
        self.blocks = _Spill(spill_dir, "blocks", np.int64)
        self.snippets: list[pa.Array] = []
        # --granularity token (one chunk): exact token prefixes, the request's own tokens kept meanwhile
        self.tokens = TokenPrefixIndex(cfg.block_size) if cfg.granularity == "token" else None

    def feed(self, batch: Batch) -> None:
        """Sort the batch in, write everything no later chunk can precede, hold back the rest."""
        if self.capacity is None:
            from prefixscan.reuse.capacity.stream import CapacityStream
            from prefixscan.reuse.capacity.whole import WholeCapacity

            self.block, self.rule = batch.block_size, batch.hit_rule
            if self.cfg.granularity == "token" and self.rule == "trace":
                raise UsageError("--granularity token needs token ids; hashed traces only support block granularity")
            self.capacity = (WholeCapacity(batch.block_size, batch.hit_rule, self.spill_dir) if self.one_chunk
                             else CapacityStream(batch.block_size, batch.hit_rule, self.spill_dir, defer_lru=True))
        inp, off, flat, snip, per_request, _ = input_frame(self.cfg, batch)
        if inp.height == 0:
            return
        if per_request is not None:  # token granularity is never chunked: the batch is the whole log
            self._process(inp, off, flat, snip, per_request)
            return
        ts = inp["timestamp_s"].to_numpy()
        first = float(ts[0])
        if first < self.written_max_ts:
            raise OutOfOrder(f"a request at t={first} s arrives after requests at t={self.written_max_ts} s "
                             "were already analysed")
        if self.pending is not None:
            inp, off, flat, snip = _concat(self.pending, (inp, off, flat, snip))
            ts = inp["timestamp_s"].to_numpy()
            if not bool((ts[1:] >= ts[:-1]).all()):  # stable: equal times keep input order
                order = np.argsort(ts, kind="stable")
                inp, off, flat, snip = _take((inp, off, flat, snip), order)
                ts = ts[order]
        cut = int(np.searchsorted(ts, first, side="right"))  # later chunks start at `first` or later
        self._process(*_slice((inp, off, flat, snip), 0, cut))
        self.pending = _slice((inp, off, flat, snip), cut, inp.height) if cut < inp.height else None

    def _process(self, inp: pl.DataFrame, offsets: np.ndarray, flat: np.ndarray, snippets: list[str],
                 per_request: tuple[list[np.ndarray], list[np.ndarray]] | None = None) -> None:
        n = inp.height
        if n == 0:
            return
        prompt = inp["prompt_tokens"].to_numpy()
        res, gid = self.ideal.add(offsets, flat, prompt, self.block, self.rule,
                                  scope_salts(inp["tenant"]), scope_salts(inp["conversation_id"]))
        cached, divergence = res.cached_tokens, res.divergence_token
        if per_request is not None and self.tokens is not None:
            hashes, toks = per_request
            ns = inp["namespace"].to_list()
            divergence = np.array([self.tokens.add(toks[i], hashes[i], ns[i]) for i in range(n)], dtype=np.int64)
            cached = hit_tokens_array(divergence, prompt, 1, self.rule)  # token granularity: blocks of one token
        if self.seq == 0:
            self.ts0 = float(inp["timestamp_s"][0])
        self.ids.add(self.seq, inp)
        df, deepest = reuse_frame(inp, offsets, flat, res, cached, divergence, self.block,
                                  self.rule, seq0=self.seq, ts0=self.ts0, source_ids=self.ids.lookup(res.source),
                                  turn_counts=self.turns)
        self.out.write(requests_arrow(df, offsets, flat), np.diff(offsets))
        self.capacity.add(offsets, gid, prompt)
        self.source.append(res.source)
        self.deepest.append(deepest)
        self.blocks.append(df["_blocks"].to_numpy())
        if snippets:
            self.snippets.append(pa.array(snippets, type=pa.string()))
        self.seq += n
        self.written_max_ts = float(inp["timestamp_s"][-1])
        memory.trim()  # a chunk's parsing and frames leave free heap behind: hand it back before the next

    def drain(self) -> None:
        """Process the held-back rows: no Batch comes any more."""
        if self.pending is not None:
            self._process(*self.pending)
            self.pending = None

    def close(self, wait: bool = True) -> None:
        """Process the held-back rows and finish the requests table (in the background with `wait=False`:
        then `self.out.wait()` before reading it)."""
        self.drain()
        self.out.close(wait=wait)


class _Spill:
    """An append-only array in a file (a column needed only after the stream ends)."""

    def __init__(self, spill_dir: str, name: str, dtype: type) -> None:
        self.dtype = np.dtype(dtype)
        fd, self.path = tempfile.mkstemp(dir=spill_dir, prefix=f"{name}.", suffix=".bin")
        self.f = os.fdopen(fd, "wb")

    def append(self, values: np.ndarray) -> None:
        np.ascontiguousarray(values, dtype=self.dtype).tofile(self.f)

    def read(self) -> np.ndarray:
        self.f.close()
        return np.fromfile(self.path, dtype=self.dtype)


def _concat(a: tuple, b: tuple) -> tuple:
    inp = pl.concat([a[0], b[0]], how="vertical")
    off = np.concatenate([a[1], b[1][1:] + a[1][-1]])
    return inp, off, np.concatenate([a[2], b[2]]), list(a[3]) + list(b[3])


def _take(part: tuple, order: np.ndarray) -> tuple:
    inp, off, flat, snip = part
    off, flat = permute_csr(off, flat, order)
    return inp[order], off, flat, [snip[i] for i in order] if snip else []


def _slice(part: tuple, a: int, b: int) -> tuple:
    inp, off, flat, snip = part
    return inp.slice(a, b - a), off[a:b + 1] - off[a], flat[off[a]:off[b]], snip[a:b] if snip else []


def turn_fill(conversation: pl.Series, counts: dict[str, int] | None) -> pl.Expr:
    """Turn index where the log has none: the request's position within its conversation, in time order.
    `counts` carries how many requests each conversation had in earlier chunks (None: this is the log)."""
    pos = pl.int_range(pl.len()).over("conversation_id")
    if counts is not None and conversation.null_count() < len(conversation):
        base = [counts.get(c, 0) if c is not None else 0 for c in conversation.to_list()]
        for c, k in conversation.drop_nulls().value_counts().iter_rows():
            counts[c] = counts.get(c, 0) + k
        pos = pos + pl.Series(base, dtype=pl.Int64)
    return (pl.when(pl.col("turn_index").is_null() & pl.col("conversation_id").is_not_null())
            .then(pos.cast(pl.Int32)).otherwise(pl.col("turn_index")).alias("turn_index"))


def reuse_frame(inp: pl.DataFrame, offsets: np.ndarray, flat: np.ndarray, res: IdealResult, cached: np.ndarray,
                divergence: np.ndarray, block: int, rule: str, *, seq0: int, ts0: float,
                source_ids: pl.Series, turn_counts: dict[str, int] | None) -> tuple[pl.DataFrame, np.ndarray]:
    """The requests rows (plus `_`-prefixed helper columns) of consecutive requests starting at `seq0`, and
    the deepest matched block hash of each (0 without a hit). `res.source` is in whole-log indices and
    `source_ids` holds the request id of each row's source (null without one)."""
    n = inp.height
    prompt = inp["prompt_tokens"].to_numpy()
    ts = inp["timestamp_s"].to_numpy()
    lengths = np.diff(offsets)
    df = inp.with_columns(
        pl.Series("seq", np.arange(seq0, seq0 + n, dtype=np.int64)),
        pl.Series("arrival_s", ts - ts0),
        pl.Series("cached_tokens", cached), pl.Series("cached_blocks", res.cached_blocks),
        pl.Series("divergence_token", divergence),
        pl.Series("conversation_cached_tokens", res.conversation_cached_tokens),
        pl.Series("tenant_cached_tokens", res.tenant_cached_tokens), pl.Series("_source", res.source),
        pl.Series("_blocks", -(-prompt // block) if rule == "vllm" else lengths),
    )
    df = df.with_columns(
        turn_fill(inp["conversation_id"], turn_counts),
        source_ids.alias("source_request_id"),
        counted_hit_blocks(pl.col("cached_tokens"), pl.col("cached_blocks").cast(pl.Int64), block,
                           rule).alias("_hit_blocks"),
    )
    df = df.with_columns(
        pl.when(pl.col("cached_tokens") == 0).then(pl.lit("none"))
        .when(pl.col("conversation_cached_tokens") >= pl.col("cached_tokens")).then(pl.lit("same_conversation"))
        .when(pl.col("tenant_cached_tokens") >= pl.col("cached_tokens")).then(pl.lit("same_tenant"))
        .otherwise(pl.lit("other_tenant")).alias("hit_source"),
        (pl.col("cached_tokens") - pl.col("actual_cached_tokens")).alias("predicted_minus_actual"),
        turn_bucket(),
    )
    df = df.with_columns(
        pl.when(pl.col("cached_tokens") == 0).then(pl.lit("none"))
        # The hit ends inside the system-and-tools head, or in the block that straddles its end.
        .when((pl.col("head_tokens") > 0) & (pl.col("cached_tokens") < pl.col("head_tokens") + block))
        .then(pl.lit("system_tools"))
        .when(pl.col("hit_source") == "same_conversation").then(pl.lit("conversation_history"))
        .otherwise(pl.lit("shared_document")).alias("prefix_class"),
    )
    deepest = np.zeros(n, dtype=np.uint64)
    k = res.cached_blocks
    hit = np.nonzero(k > 0)[0]
    deepest[hit] = flat[offsets[hit] + k[hit] - 1]
    return df, deepest


def turn_bucket() -> pl.Expr:
    """The summaries' turn dimension: the turn index, with 10 and later as one bucket."""
    return (pl.when(pl.col("turn_index") >= 10).then(pl.lit("10+"))
            .otherwise(pl.col("turn_index").cast(pl.String)).alias("_turn_bucket"))
