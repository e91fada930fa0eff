"""Streaming `analyze`: the log flows through in chunks and its requests table goes to Parquet as it goes.

Ideal reuse is causal (a request's hit depends only on earlier requests), so each chunk's rows are final
once the chunks before it are in: `IdealStream` carries the per-scope state (the whole log's dense ids and
last request per distinct block; the blocks each tenant and conversation scope has seen), rows are written
in the row groups `rundir.write_table` cuts (`rundir.group_ends`), the capacity curve's per-block input is
spilled to disk (`CapacityStream`), and the aggregates read back only the columns they need, one or a few
at a time. Memory grows with distinct blocks and a few bytes per request,
not with total tokens; the tables are identical to the in-memory path's (tests compare them byte for byte).

Analysis order is time, then input order. Chunks arrive in input order; a chunk is held back until the
next arrives, so disorder within one chunk's reach is sorted out. A request older than one already written
raises `OutOfOrder`, and `analysis` then analyses the log in memory instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan import memory
from prefixscan.config import AnalyzeConfig
from prefixscan.ingest import Batch, Ingested, ingest
from prefixscan.io import rundir
from prefixscan.io.sources import Source
from prefixscan.requests_frame import input_frame, requests_arrow, reuse_frame, turn_bucket
from prefixscan.reuse.aggregate import summaries_table
from prefixscan.reuse.ideal import IdealStream, scope_salts
from prefixscan.reuse.prefixes import ROW_COLUMNS, aggregate_prefixes, member, top_prefix_hashes
from prefixscan.schema import REQUESTS_SCHEMA


class OutOfOrder(Exception):
    """The log goes back in time further than one chunk: it cannot be analysed as a stream."""


@dataclass
class StreamOutcome:
    """What `analysis` needs from a streamed run to finish it like an in-memory one."""

    ing: Ingested
    agg: pl.DataFrame  # the per-request hit-rate columns the summary reads (no text, no block lists)
    side: Any  # prefixscan.analysis.SideStats: the summary's other per-request statistics
    summaries: pl.DataFrame
    prefixes: pl.DataFrame
    curve: pa.Table
    requests_path: Path  # the finished requests table (a temporary name inside the run directory)
    rows: int
    findings_input: Callable[[], tuple[pl.DataFrame, Iterator[tuple[np.ndarray, np.ndarray]]]]


class _RowGroups:
    """requests.parquet written group by group, with the settings and group cuts of `rundir.write_table`
    (`rundir.group_ends`), so a streamed file has the bytes of one written at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.parts: list[pa.Table] = []
        self.lengths: list[np.ndarray] = []
        self.writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table, lengths: np.ndarray) -> None:
        """Buffer rows (with their block counts); write every group that can no longer grow."""
        self.parts.append(table)
        self.lengths.append(np.asarray(lengths, dtype=np.int64))
        ends = rundir.group_ends(np.concatenate(self.lengths))
        full = ends[-1] - (ends[-2] if len(ends) > 1 else 0) == rundir.ROW_GROUP_SIZE
        self._flush(ends if full else ends[:-1])

    def _flush(self, ends: list[int]) -> None:
        if not ends:
            return
        whole = pa.concat_tables(self.parts)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, REQUESTS_SCHEMA, **rundir.parquet_options(REQUESTS_SCHEMA))
        start = 0
        for end in ends:
            rundir.write_group(self.writer, whole.slice(start, end - start))
            start = end
        rest = whole.slice(start)
        lengths = np.concatenate(self.lengths)[start:]
        self.parts, self.lengths = ([rest], [lengths]) if rest.num_rows else ([], [])

    def close(self) -> None:
        if self.parts:
            self._flush(rundir.group_ends(np.concatenate(self.lengths)))
        if self.writer is not None:
            self.writer.close()
        else:  # no rows: the same empty file the in-memory path writes
            rundir.write_parquet(REQUESTS_SCHEMA.empty_table(), self.path)


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

    def __init__(self, cfg: AnalyzeConfig, path: Path, spill_dir: str) -> None:
        self.cfg = cfg
        self.out = _RowGroups(path)
        self.spill_dir = spill_dir
        self.ideal = IdealStream()
        self.ids = _RequestIds()
        self.capacity: Any = None
        self.block = self.rule = None
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

    def feed(self, batch: Batch) -> None:
        """Sort the batch in, write everything no later chunk can precede, hold back the rest."""
        if self.capacity is None:
            from prefixscan.reuse.capacity_stream import CapacityStream

            self.block, self.rule = batch.block_size, batch.hit_rule
            self.capacity = CapacityStream(batch.block_size, batch.hit_rule, self.spill_dir, defer_lru=True)
        inp, off, flat, snip, _, _ = input_frame(self.cfg, batch)
        if inp.height == 0:
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

    def _process(self, inp: pl.DataFrame, offsets: np.ndarray, flat: np.ndarray, snippets: list[str]) -> None:
        n = inp.height
        if n == 0:
            return
        prompt = inp["prompt_tokens"].to_numpy()
        res, gid = self.ideal.add(offsets, flat, prompt, self.block, self.rule,
                                  scope_salts(inp["tenant"]), scope_salts(inp["conversation_id"]))
        if self.seq == 0:
            self.ts0 = float(inp["timestamp_s"][0])
        self.ids.add(self.seq, inp)
        df, deepest = reuse_frame(inp, offsets, flat, res, res.cached_tokens, res.divergence_token, self.block,
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

    def close(self) -> None:
        if self.pending is not None:
            self._process(*self.pending)
            self.pending = None
        self.out.close()


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
    from prefixscan.tracecols import permute_csr

    inp, off, flat, snip = part
    off, flat = permute_csr(off, flat, order)
    return inp[order], off, flat, [snip[i] for i in order] if snip else []


def _slice(part: tuple, a: int, b: int) -> tuple:
    inp, off, flat, snip = part
    return inp.slice(a, b - a), off[a:b + 1] - off[a], flat[off[a]:off[b]], snip[a:b] if snip else []


def run_stream(cfg: AnalyzeConfig, run_path: Path, progress: Callable[[int, int, int], None] | None,
               done: Callable[[str, float], float], t0: float, sources: list[Source]) -> StreamOutcome:
    """Ingest, reuse and write requests in one streamed pass, then the aggregates and the capacity curve."""
    memory.fixed_mmap_threshold()
    fd, tmp = tempfile.mkstemp(dir=run_path, prefix=".requests.", suffix=".tmp")
    os.close(fd)
    spill = tempfile.mkdtemp(dir=run_path, prefix=".spill.")
    stream = RequestStream(cfg, Path(tmp), spill)
    try:
        ing = ingest(cfg, progress, sink=stream.feed, sources=sources)
        stream.close()
    except BaseException:
        _discard(stream, tmp, spill)
        raise
    n_distinct = stream.ideal.n_distinct
    stream.ideal.release()
    memory.trim()
    t = done("ingest", t0)
    t = done("reuse", t)  # reuse ran inside the streamed ingest
    try:
        # The capacity curve first: its state then never shares the process with the aggregates' columns.
        if stream.capacity is None:
            from prefixscan.reuse.capacity import capacity_curve

            curve = capacity_curve(np.zeros(1, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64),
                                   ing.block_size, ing.hit_rule, list(cfg.capacities) if cfg.capacities else None)
        else:
            from prefixscan.reuse.capacity_sampled import auto_rate

            curve = stream.capacity.finish(n_distinct, list(cfg.capacities) if cfg.capacities else None,
                                           sample=auto_rate(cfg.capacity_sample, stream.capacity.total_blocks))
        memory.trim()
        t = done("capacity", t)
        agg, side, summaries, prefixes = _aggregates(cfg, stream, Path(tmp))
        memory.trim()
        done("aggregate", t)
    except BaseException:
        _discard(stream, tmp, spill)
        raise
    _discard(stream, None, spill)
    return StreamOutcome(ing, agg, side, summaries, prefixes, curve, Path(tmp), stream.seq,
                         lambda: _findings_input(Path(tmp), ing))


def _discard(stream: RequestStream, tmp: str | None, spill: str) -> None:
    if stream.capacity is not None:
        stream.capacity.close()
    for kept in (stream.source, stream.deepest, stream.blocks):
        kept.f.close()
    shutil.rmtree(spill, ignore_errors=True)
    if tmp is not None and os.path.exists(tmp):
        if stream.out.writer is not None:
            stream.out.writer.close()
        os.remove(tmp)


def _read(path: Path, names: list[str]) -> pl.DataFrame:
    """Columns read by polars itself (through Arrow they would be two copies), each made one contiguous
    chunk in turn, so the read holds the columns plus one column's copy at most."""
    df = pl.read_parquet(path, columns=names)
    return pl.DataFrame([df.drop_in_place(c).rechunk() for c in names])


def _aggregates(cfg: AnalyzeConfig, stream: RequestStream, path: Path) -> tuple[pl.DataFrame, Any, pl.DataFrame,
                                                                                  pl.DataFrame]:
    """(the summary's per-request frame, its side statistics, summaries, prefixes) from the written table
    and the kept arrays."""
    from prefixscan.analysis import SUMMARY_DIMENSIONS, SideStats

    source = stream.source.read()
    # Prefixes first, from two columns: their sort and the rows they read back never meet the base frame.
    hits = _read(path, ["cached_blocks", "cached_tokens"])
    prefixes = _prefixes(cfg, path, hits, stream.deepest.read(), source, stream.snippets)
    memory.trim()
    # Only the columns the rates read (rows are in analysis order, so the steady state is a slice).
    base = hits.with_columns(_read(path, ["prompt_tokens"])["prompt_tokens"],
                             pl.Series("_blocks", stream.blocks.read()))
    del hits
    base = base.with_columns((pl.col("cached_tokens") // stream.block if stream.rule == "vllm"
                              else pl.col("cached_blocks").cast(pl.Int64)).alias("_hit_blocks")).drop("cached_blocks")

    def column(name: str) -> pl.Series:
        if name == "_turn_bucket":
            return _read(path, ["turn_index"]).select(turn_bucket())["_turn_bucket"]
        return _read(path, [name])[name]

    summaries = summaries_table(base, SUMMARY_DIMENSIONS, column)
    agg = base.with_columns(_read(path, ["tenant_cached_tokens"]))
    side = SideStats(*SideStats.conversation_counts(column("conversation_id")),
                     SideStats.reuse_gaps(column("arrival_s").to_numpy(), source), _actual_rows(path))
    return agg, side, summaries, prefixes


def _actual_rows(path: Path) -> pl.DataFrame:
    """Rows with an engine-reported cached count, read row group by row group with that filter."""
    import pyarrow.dataset as ds

    cols = ["seq", "request_id", "tenant", "prompt_tokens", "cached_tokens", "actual_cached_tokens",
            "predicted_minus_actual"]
    t = ds.dataset(path, format="parquet").to_table(columns=cols, filter=ds.field("actual_cached_tokens").is_valid())
    return pl.from_arrow(t)  # type: ignore[return-value]


def _prefixes(cfg: AnalyzeConfig, path: Path, hits: pl.DataFrame, deepest: np.ndarray,
              source: np.ndarray, snippets: list[pa.Array]) -> pl.DataFrame:
    """The prefixes table: rank on (deepest block, hit) kept on disk, then read back only the rows of the
    top prefixes (and the ids and snippets of a thousand first hits)."""
    hit = hits["cached_blocks"].to_numpy() > 0
    keep = top_prefix_hashes(deepest[hit], hits["cached_tokens"].to_numpy()[hit])
    rows = np.nonzero(hit & member(deepest, keep))[0]
    if not len(rows):
        return aggregate_prefixes(pl.DataFrame(), list, list)
    df = _rows(path, rows, list(ROW_COLUMNS)).with_columns(pl.Series("prefix_hash", deepest[rows], dtype=pl.UInt64))
    text = pa.chunked_array(snippets) if snippets else None

    def first_ids(seqs: np.ndarray) -> list[str]:
        order = np.argsort(seqs)
        ids = _rows(path, seqs[order], ["request_id"])["request_id"].to_list()
        out = [""] * len(seqs)
        for i, v in zip(order.tolist(), ids, strict=True):
            out[i] = v
        return out

    def first_snippets(seqs: np.ndarray) -> list[str]:
        src = source[seqs]
        if text is None:
            return [""] * len(seqs)
        got = text.take(pa.array(np.maximum(src, 0))).to_pylist()
        return [g if s >= 0 else "" for g, s in zip(got, src.tolist(), strict=True)]

    def own_snippets(seqs: np.ndarray) -> list[str]:
        return text.take(pa.array(seqs)).to_pylist() if text is not None else [""] * len(seqs)

    return aggregate_prefixes(df, first_ids, first_snippets, include_text=cfg.include_text,
                              own_snippets=own_snippets, k=cfg.snippet_k)


def _rows(path: Path, rows: np.ndarray, columns: list[str]) -> pl.DataFrame:
    """The given rows (ascending) of some columns, read one row group at a time."""
    pf = pq.ParquetFile(path)
    frames, start = [], 0
    for g in range(pf.num_row_groups):
        size = pf.metadata.row_group(g).num_rows
        sel = rows[(rows >= start) & (rows < start + size)] - start
        if len(sel):
            frames.append(pl.from_arrow(pf.read_row_group(g, columns=columns).take(pa.array(sel))))
        start += size
    return pl.concat(frames)  # type: ignore[arg-type]


def _findings_input(path: Path, ing: Ingested) -> tuple[pl.DataFrame, Iterator[tuple[np.ndarray, np.ndarray]]]:
    """(requests frame, block hashes chunk by chunk) for findings. The counterfactual re-analysis reads
    every request's blocks, one row group at a time, only when the detector saw chat records; otherwise
    only the rows with an engine value are needed."""
    if ing.detector is not None and ing.detector.fed:
        req = _read(path, ["seq", "request_id", "tenant", "conversation_id", "user", "prompt_tokens", "cached_tokens",
                           "actual_cached_tokens",
                           "predicted_minus_actual"])
        return req, _block_groups(path)
    return _actual_rows(path), iter(())


def _block_groups(path: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(local CSR offsets, hashes) of the requests table, one row group at a time."""
    pf = pq.ParquetFile(path)
    for g in range(pf.num_row_groups):
        lists = pf.read_row_group(g, columns=["block_hashes"]).column(0).combine_chunks()
        offsets = lists.offsets.to_numpy().astype(np.int64)
        yield offsets - offsets[0], lists.values.to_numpy()[offsets[0]:offsets[-1]]
