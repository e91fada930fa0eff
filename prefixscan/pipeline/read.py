"""Read stage: input files -> accepted records, rejects and compiled trace chunks, in input order.

`Reader.events()` yields one of: a list of accepted `Record`s (a batch for the encode stage), a `Reject`
(file, line, reason), a `TraceChunk` (Mooncake lines the compiled reader parsed, already namespaced) and
`CHUNK_END` after each compiled chunk. Every record read is either accepted or rejected; the counts and
what the summary says about the input (shapes, clock) are on the Reader once the events are consumed.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.encoder import root_of
from prefixscan.encode.hashing import mix_ids, mix_ids_per
from prefixscan.errors import InputError
from prefixscan.pipeline import config as pc
from prefixscan.read.fielduse import TRACE_UNITS, FieldUse
from prefixscan.read.readers import Position, RawError, layout, parse_line, read_jsonl, read_source
from prefixscan.read.record import Record, RecordError
from prefixscan.read.shapes import CLOCKLESS, detect, missing_timestamp, normalise
from prefixscan.read.sources import Source
from prefixscan.redact import reject_detail


@dataclass(slots=True)
class Reject:
    """A record that cannot be accepted, and why (a row of the rejects table)."""

    source_file: str
    source_line: int
    reason: str
    detail: str


@dataclass
class TraceChunk:
    """Mooncake lines of one compiled chunk: arrays, with no Python object per request."""

    path: str
    line: np.ndarray
    ts_s: np.ndarray
    prompt: np.ndarray
    root: np.uint64
    lengths: np.ndarray
    flat: np.ndarray  # namespaced block ids
    ints: dict[str, np.ndarray] = field(default_factory=dict)


CHUNK_END = "chunk_end"  # a compiled chunk and its odd lines are complete: a Batch may be cut here
Event = list[Record] | Reject | TraceChunk | str


class Reader:
    """Reads `sources` in order; `batch` records per yielded list."""

    def __init__(self, cfg: AnalyzeConfig, sources: list[Source], batch: int,
                 progress: Callable[[int, int, int], None] | None = None) -> None:
        pc.check_read_options(cfg)
        self.cfg, self.sources, self.batch_size, self.progress = cfg, sources, batch, progress
        self.overrides = dict(cfg.fields)
        self.read = 0
        self.ordered = 0  # records timed by input order
        # Per file: True when its first accepted record has a timestamp (then every record needs one), False
        # when it has none (the file is timed by input order, like --order input), absent until decided
        self.clock: dict[str, bool] = {}
        self.clock_ignored: dict[str, int] = {}  # timestamps met later in a file timed by input order
        self.fields = FieldUse(self.overrides)
        self.shapes: dict[str, str] = {}
        self.mode: str | None = None  # "tokens" or a trace name; runs cannot mix block sizes
        self.seen_ids: set[str] = set()
        self.bailian_roots: dict[Any, Any] = {}
        self.total_bytes = sum(s.size for s in sources)
        self.done_bytes = 0
        self.pos = Position()
        self.batch: list[Record] = []

    def block_rule(self) -> tuple[int, str]:
        """(block size, hit rule) of what was read: a trace's own block size, or the tokens'."""
        if self.mode in pc.TRACE_BLOCK:
            return self.cfg.hash_block_size or pc.TRACE_BLOCK[self.mode], "trace"
        return self.cfg.block_size, "vllm"

    def events(self) -> Iterator[Event]:
        for src in self.sources:
            shape = self._forced_shape()
            self.pos.bytes = 0
            if (pc.FAST_MOONCAKE and src.kind == "jsonl" and not self.overrides
                    and (shape or _peek_shape(src)) == "mooncake" and layout(src.path) == "lines"):
                self.shapes[src.path] = "mooncake"
                yield from self._fast_mooncake(src)
            else:
                yield from self._ordinary(src, shape)
            self.done_bytes += src.size
        if self.batch:
            yield self._take()
        if self.progress is not None:
            self.progress(self.read, self.total_bytes, self.total_bytes)

    def _forced_shape(self) -> str | None:
        if self.cfg.format != "auto":
            return self.cfg.format
        if "messages" in self.overrides:  # the prompt is where --field says: a chat record
            return "chat"
        return "completion" if "prompt" in self.overrides else None

    def _take(self) -> list[Record]:
        out, self.batch = self.batch, []
        return out

    def _reject(self, path: str, line: int, reason: str, detail: str) -> Iterator[Event]:
        if self.cfg.strict and self.batch:  # earlier records may fail to encode: they go first
            yield self._take()
        yield Reject(path, line, reason, detail)

    def _ordinary(self, src: Source, shape: str | None) -> Iterator[Event]:
        for line, obj in read_source(src, self.pos):
            self.read += 1
            if self.progress is not None and self.read % 1000 == 0:
                self.progress(self.read, self.done_bytes + self.pos.bytes, self.total_bytes)
            if shape is None and isinstance(obj, dict):
                try:
                    shape = detect(obj)
                    self.shapes[src.path] = shape
                except RecordError as exc:
                    yield from self._reject(src.path, line, exc.reason, exc.detail)
                    continue
            rec = yield from self._accept(src, line, obj, shape)
            if rec is None:
                continue
            self.batch.append(rec)
            if len(self.batch) >= self.batch_size:
                yield self._take()
        if shape is not None:
            self.shapes.setdefault(src.path, shape)

    def _accept(self, src: Source, line: int, obj: dict[str, Any] | RawError,
                shape: str | None) -> Generator[Event, None, Record | None]:
        """One parsed line: returns its Record, or None after yielding its Reject."""
        if isinstance(obj, RawError):
            yield from self._reject(src.path, line, obj.reason, obj.detail)
            return None
        try:
            shape = shape or detect(obj)
            rec = normalise(obj, shape, src.path, line, self.overrides, self.bailian_roots, self.fields)
            by_order = self._by_order(src.path, shape, rec.timestamp_s != rec.timestamp_s)  # NaN: no timestamp
        except RecordError as exc:
            yield from self._reject(src.path, line, exc.reason, exc.detail)
            return None
        if rec.request_id in self.seen_ids:
            yield from self._reject(src.path, line, "duplicate_id",
                                    reject_detail("request_id", "was already seen; the first occurrence is kept",
                                                  rec.request_id))
            return None
        self.seen_ids.add(rec.request_id)
        if by_order:
            rec.timestamp_s = float(self.ordered)
            self.ordered += 1
        self._set_mode(shape if rec.kind == "hashed" else "tokens", f"{src.path}:{line}")
        return rec

    def _by_order(self, path: str, shape: str, no_clock: bool) -> bool:
        """Whether a record is timed by its place in the input rather than by its timestamp: always under
        --order input or for a shape with no clock; in a file whose first record has no timestamp (and no
        --field timestamp), every record of the file (a later timestamp would mix two clocks: it is counted
        and ignored). A record with no timestamp in a file whose records have one raises missing_timestamp."""
        if self.cfg.order == "input" or shape in CLOCKLESS:
            return True
        state = self.clock.get(path)
        if state is None:
            if no_clock and "timestamp" in self.overrides:
                raise missing_timestamp(self.overrides)
            state = self.clock[path] = not no_clock
        if state:
            if no_clock:
                raise missing_timestamp(self.overrides)
            return False
        if not no_clock:
            self.clock_ignored[path] = self.clock_ignored.get(path, 0) + 1
        return True

    def clock_notes(self) -> list[str]:
        """The summary's word on files timed by input order because their records carry no timestamp."""
        files = [p for p, clocked in self.clock.items() if not clocked]
        if not files:
            return []
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        ignored = sum(self.clock_ignored.get(p, 0) for p in files)
        return [f"{len(files)} file(s) have no timestamp on their first record and were timed by input order "
                f"(one request a second): {shown}"
                + (f"; {ignored:,} later record(s) there had a timestamp, ignored so as not to mix two clocks"
                   if ignored else "")
                + ". Map the log's time with --field timestamp=PATH if it has one."]

    def _set_mode(self, this_mode: str, where: str) -> None:
        if self.mode is None:
            self.mode = this_mode
        elif self.mode != this_mode:
            raise InputError(f"{where}: cannot mix {this_mode} records with {self.mode} records in "
                             "one run (their block sizes differ); analyze them separately")

    def _fast_mooncake(self, src: Source) -> Iterator[Event]:
        """A Mooncake JSONL file through the compiled reader; odd lines take the ordinary path."""
        from prefixscan.read.mooncake import iter_chunks  # compiled kernels: loaded only for a trace

        if self.batch:  # earlier files' records first: input order is analysis order for equal times
            yield self._take()
        root = mooncake_root(self.cfg, src.path)
        for chunk in iter_chunks(src.path, self.pos, ids=lambda raw: mix_ids(raw, root)):  # mixed on the parse thread
            self.read += chunk.non_blank
            if len(chunk.line):
                self._set_mode("mooncake", f"{src.path}:{int(chunk.line[0])}")
                self.fields.add({"timestamp": "timestamp"}, TRACE_UNITS["mooncake"], n=len(chunk.line))
                yield TraceChunk(src.path, chunk.line, chunk.timestamp_ms / 1000.0, chunk.input_length,
                                 np.uint64(root), chunk.lengths, chunk.ids, {"output_tokens": chunk.output_length})
            for line, raw in chunk.slow:
                obj = raw if isinstance(raw, RawError) else parse_line(raw)  # RawError: a damaged file
                if obj is None:
                    self.read -= 1
                    continue
                rec = yield from self._accept(src, line, obj, "mooncake")
                if rec is not None:
                    self.batch.append(rec)
            if self.batch:
                yield self._take()
            yield CHUNK_END
            if self.progress is not None:
                self.progress(self.read, self.done_bytes + self.pos.bytes, self.total_bytes)


def mooncake_root(cfg: AnalyzeConfig, path: str) -> int:
    """The namespace of a canonical Mooncake line: a record with no model, adapter, salt or tenant."""
    return trace_root(cfg, Record(source_file=path, source_line=0, request_id="", timestamp_s=0.0, kind="hashed"))


def _peek_shape(src: Source, max_lines: int = 1000) -> str | None:
    """The shape the ordinary path would detect for this file (its first parsable object), or None."""
    for i, (_, obj) in enumerate(read_jsonl(src.path)):  # a damaged file yields a RawError, not an error
        if i >= max_lines:
            return None
        if isinstance(obj, dict):
            try:
                return detect(obj)
            except RecordError:
                return None
    return None


def trace_root(cfg: AnalyzeConfig, r: Record) -> int:
    """A hashed-trace record's namespace. Each trace file has its own id space (docs/engines.md,
    'Public traces'): the file is part of the namespace."""
    return root_of(cfg, r, "trace", f"trace:{r.source_file}")


def trace_mixer(cfg: AnalyzeConfig) -> Callable[[list[Record]], tuple[np.ndarray, np.ndarray]]:
    """Namespace a batch of hashed-trace records in one vectorised call (per-request numpy calls dominated):
    (root per record, their namespaced ids concatenated in order)."""
    roots: dict[tuple[Any, ...], int] = {}

    def mix(recs: list[Record]) -> tuple[np.ndarray, np.ndarray]:
        rs = []
        for r in recs:
            key = (r.model, r.adapter, r.cache_salt, r.tenant if cfg.isolate_tenants else None, r.source_file)
            root = roots.get(key)
            if root is None:
                root = roots[key] = trace_root(cfg, r)
            rs.append(root)
        ids = [r.hash_ids if r.hash_ids is not None else np.zeros(0, np.int64) for r in recs]
        root_arr = np.asarray(rs, dtype=np.uint64)
        return root_arr, mix_ids_per(np.concatenate(ids), np.repeat(root_arr, [len(x) for x in ids]))

    return mix
