"""Encode stage: read events -> `Batch`es of encoded requests (columns, block hashes), in input order.

Text records are rendered, tokenised and hashed here or, on large inputs, by worker processes
(`encode_pool.py`) while the read stage goes on; their results are taken in submission order, DEPTH jobs
behind the reading. Hashed-trace records become arrays (`trace_columns.py`). Each accepted chat record is
seen once here by the findings detector and the conversation inference. A Batch is cut every
STREAM_TEXT_ROWS text requests or compiled trace chunk (or, with `one_chunk`, once at the end; with
`text_chunks` too, text still every ONE_CHUNK_TEXT_ROWS requests, for the reuse stage to take as they come).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.encoder import (
    Hashed,
    Identity,
    LazyTokenizer,
    RecordEncoder,
    Rejected,
    auto_workers,
    merge_stats,
    shared_chain_cache,
)
from prefixscan.errors import RejectError
from prefixscan.pipeline import config as pc
from prefixscan.pipeline.encode_pool import DEPTH, EncodePool
from prefixscan.pipeline.read import CHUNK_END, Reader, Reject, TraceChunk, trace_mixer
from prefixscan.read.content import content_text
from prefixscan.read.record import Record
from prefixscan.read.sources import Source, expand
from prefixscan.read.trace_columns import TraceColumns

COLS = ("request_id", "source_file", "source_line", "timestamp_s", "tenant", "conversation_id",
        "conversation_inferred", "user", "model", "adapter", "cache_salt", "replica", "category", "turn_index",
        "prompt_tokens", "head_tokens", "output_tokens", "actual_cached_tokens", "ttft_s", "e2e_s",
        "queue_wait_s", "namespace")
_DERIVED = ("prompt_tokens", "head_tokens", "namespace", "conversation_inferred")


@dataclass
class Batch:
    """Consecutive accepted requests (input order): the columns as lists (`cols`, `hashes`, `snippets`,
    `tokens` for --granularity token) or, for hashed traces, a frame with CSR blocks."""

    block_size: int
    hit_rule: str
    cols: dict[str, list[Any]]
    hashes: list[np.ndarray]
    snippets: list[str]
    frame: Any = None
    offsets: np.ndarray | None = None
    flat: np.ndarray | None = None
    tokens: list[np.ndarray] | None = None
    last: bool = False  # the encode stage's last Batch: the reuse stage need hold nothing back after it


@dataclass
class PromptCheck:
    """The log's own prompt token counts against prefixscan's: a wrong tokenizer or template shows here."""

    compared: int = 0
    differ: int = 0  # by more than 2% and 2 tokens
    abs_diff: int = 0

    def add(self, reported: int | None, ours: int) -> None:
        if reported is None:
            return
        self.compared += 1
        d = abs(reported - ours)
        self.abs_diff += d
        self.differ += d > 2 and d > 0.02 * max(reported, ours)


@dataclass
class Ingested:
    """What read and encode learnt about the input once every Batch went out: the rejects, the counts
    and what the summary says about the input."""

    rejects: list[dict[str, Any]]
    read: int
    sources: list[Source]
    shapes: dict[str, str]
    block_size: int
    hit_rule: str
    tokenizer_id: str
    template_version: str
    approximate_template: bool
    tokenizer_stats: dict[str, Any] = field(default_factory=dict)
    input_ordered: int = 0  # records whose time is their place in input order (no clock, or --order input)
    prompt_check: PromptCheck = field(default_factory=lambda: PromptCheck())
    detector: Any = None  # prefixscan.detect.Detector when findings are on (fed here, finalised in detect)
    conversations_inferred: int = 0  # chat requests given an inferred conversation id
    conversations_continued: int = 0  # of those, requests found to continue an earlier request
    fields: Any = None  # prefixscan.read.shapes.FieldUse: which log keys became tenant, timestamp, ...
    read_notes: list[str] = field(default_factory=list)  # what the read stage must say (files timed by order)


def _user_turns(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "user")


def _snippet(r: Record) -> str:
    """Where the prompt starts, kept in memory only; redacted when a prefixes row shows it."""
    if r.messages:
        return " | ".join(content_text(m.get("content"))[:80] for m in r.messages[:2])
    return (r.prompt or "")[:160]


def ingest(cfg: AnalyzeConfig, progress: Callable[[int, int, int], None] | None = None,
           sink: Callable[[Batch], None] | None = None, sources: list[Source] | None = None,
           one_chunk: bool = False, encoder: RecordEncoder | None = None, text_chunks: bool = False) -> Ingested:
    """Read and encode every input, handing each Batch to `sink` (dropped without one). `encoder`: encodes
    text records in this process instead of a RecordEncoder and worker processes (the Ray engine's, which
    looks up what the cluster encoded). `text_chunks` (with `one_chunk`): text still comes in Batches of
    ONE_CHUNK_TEXT_ROWS as they complete (traces once at the end)."""
    sources = sources if sources is not None else expand(list(cfg.inputs))
    stage = EncodeStage(cfg, sources, one_chunk, encoder, text_chunks)
    reader = Reader(cfg, sources, pc.POOL_BATCH if stage.n_workers else pc.BATCH, progress)
    for batch in stage.batches(reader):
        if sink is not None:
            sink(batch)
    return stage.result(reader)


class EncodeStage:
    """Consumes the read stage's events, yields Batches; `result` once they are all out."""

    def __init__(self, cfg: AnalyzeConfig, sources: list[Source], one_chunk: bool = False,
                 encoder: RecordEncoder | None = None, text_chunks: bool = False) -> None:
        self.cfg, self.sources, self.one_chunk, self.text_chunks = cfg, sources, one_chunk, text_chunks
        self.keep_tokens = cfg.granularity == "token"
        # A given encoder (the Ray engine's) encodes in this process: no workers are started.
        self.n_workers = auto_workers(cfg, sum(s.size for s in sources)) if encoder is None else 0
        self.encoder = encoder if encoder is not None else RecordEncoder(cfg, self.keep_tokens)
        self.pool: EncodePool | None = None
        self.pending: deque[list[Record]] = deque()
        # the workers' tokenizer identity and counters, once closed
        self.ident: Identity | None = None
        self.stats: list[dict[str, Any]] = []
        self.rejects: list[dict[str, Any]] = []
        self.prompt_check = PromptCheck()
        self.trace = TraceColumns()
        self.mix_traces = trace_mixer(cfg)
        self._new_columns()
        self.detector = None  # findings: the detector sees each accepted chat record once, here
        if cfg.findings:
            from prefixscan.detect import Detector

            self.detector = Detector(cfg.block_size)
            self.detector.chains = shared_chain_cache(1.0, cfg)  # its rewrites hash as the run does (--hash)
        self.infer = None
        if cfg.infer_conversations:
            from prefixscan.reuse.conversations import ConversationInference

            self.infer = ConversationInference()

    def _new_columns(self) -> None:
        self.cols: dict[str, list[Any]] = {c: [] for c in COLS}
        self.hashes: list[np.ndarray] = []
        self.snippets: list[str] = []
        self.tokens: list[np.ndarray] | None = [] if self.keep_tokens else None

    def batches(self, reader: Reader) -> Iterator[Batch]:
        self.block_rule = reader.block_rule
        with ExitStack() as self.stack:  # stops the encode workers if reading fails
            for ev in reader.events():
                if isinstance(ev, Reject):
                    self._reject(ev)
                elif isinstance(ev, TraceChunk):
                    self._drain()
                    self.trace.add(ev.path, ev.line, ev.ts_s, ev.prompt, ev.root, ev.lengths, ev.flat, ints=ev.ints)
                elif ev is CHUNK_END:
                    yield from self._emit(chunk_done=True)
                else:
                    self._flush(ev)  # type: ignore[arg-type]  # the one str event is CHUNK_END
                    yield from self._emit()
            self._drain()
            yield from self._emit(final=True)
            if self.pool is not None:
                self.ident, self.stats = self.pool.close()

    def _reject(self, r: Reject, drain: bool = True) -> None:
        if self.cfg.strict:  # an earlier record may fail to encode: report the first bad record in the file
            if drain:
                self._drain()
            raise RejectError(f"{r.source_file}:{r.source_line}: {r.reason}: {r.detail} "
                              "(run without --strict to collect rejects)")
        self.rejects.append({"source_file": r.source_file, "source_line": r.source_line, "reason": r.reason,
                             "detail": r.detail})

    def _flush(self, batch: list[Record]) -> None:
        hashed = [r for r in batch if r.kind == "hashed"]
        if hashed:  # traces are kept as arrays (no per-request lists); runs cannot mix them with text
            self.trace.add_records(hashed, *self.mix_traces(hashed))
        texty = [r for r in batch if r.kind != "hashed"]
        if not texty:
            return
        if not self.n_workers:
            self._accept(texty, self.encoder.encode(texty))
            return
        if self.pool is None:
            self.pool = self.stack.enter_context(EncodePool(self.cfg, self.keep_tokens, self.n_workers, self.encoder))
            if self.detector is not None:  # for the findings' token offsets and late rewrites, loaded if needed
                self.detector.tokenizer = LazyTokenizer(self.encoder.load)
        self.pool.submit("encode", texty)
        self.pending.append(texty)
        while self.pool.inflight > DEPTH:
            self._take_one()

    def _take_one(self) -> None:
        """Take the oldest job's results back from the workers."""
        kind, results = self.pool.collect()  # type: ignore[union-attr]
        if kind == "encode":
            self._accept(self.pending.popleft(), results)
        else:
            for rid, parts, n in results:
                self.detector.put_rewritten(rid, parts, n)  # type: ignore[union-attr]

    def _drain(self) -> None:
        while self.pool is not None and self.pool.inflight:
            self._take_one()

    def _accept(self, texty: list[Record], results: list[Hashed | Rejected]) -> None:
        """Encoded records into the columns (or the rejects), in input order; the detector sees them."""
        for r, e in zip(texty, results, strict=True):
            if isinstance(e, Rejected):
                self._reject(Reject(r.source_file, r.source_line, e.reason, e.detail), drain=False)
                continue
            self._columns(r, e)
        if self.detector is None:
            return
        if self.pool is None:
            self.detector.flush(self.encoder.load())
        elif self.detector.pending:  # with workers, a worker tokenises and hashes the rewrites as well
            self.pool.submit("rewrite", self.detector.take_pending())

    def _columns(self, r: Record, e: Hashed) -> None:
        cols = self.cols
        if r.turn_index is None and r.messages:
            users = _user_turns(r.messages)  # counted once: it walks the whole history
            r.turn_index = users - 1 if users else None
        inferred = self.infer is not None and r.conversation_id is None and bool(r.messages)
        if inferred:
            r.conversation_id = self.infer.assign(r.request_id, r.tenant, r.model, r.messages)  # type: ignore[union-attr,arg-type]  # `inferred`: both set
        cols["conversation_inferred"].append(inferred)
        for c in COLS:
            if c not in _DERIVED:
                cols[c].append(getattr(r, c))
        cols["prompt_tokens"].append(e.n_tokens)
        self.prompt_check.add(r.reported_prompt_tokens, e.n_tokens)
        cols["head_tokens"].append(e.head_tokens)
        cols["namespace"].append(e.root)
        self.hashes.append(e.hashes)
        self.snippets.append(_snippet(r))
        if self.tokens is not None:
            self.tokens.append(e.tokens)  # type: ignore[arg-type]  # kept: keep_tokens
        if self.detector is not None and r.kind == "chat":
            if e.detect is not None:  # what a worker derived for the detector beside the encoding
                self.detector.contents.adopt(*e.detect)
            self.detector.feed(r, e.root)

    def _emit(self, final: bool = False, chunk_done: bool = False) -> Iterator[Batch]:
        """What is collected as Batches: a trace every compiled chunk (or STREAM_TRACE_ROWS requests),
        text every STREAM_TEXT_ROWS requests, and whatever is left at the end, marked `last` (`one_chunk`: only
        what is left at the end, but text every ONE_CHUNK_TEXT_ROWS requests with `text_chunks`)."""
        if self.one_chunk and not (final or self.text_chunks):
            return
        out = []
        traces_now = final or (not self.one_chunk and (chunk_done or self.trace.n >= pc.STREAM_TRACE_ROWS))
        if self.trace.n and traces_now:
            frame, off, flat = self.trace.finish()
            self.trace = TraceColumns()
            out.append(Batch(*self.block_rule(), cols={}, hashes=[], snippets=[], frame=frame, offsets=off, flat=flat))
        rows = pc.ONE_CHUNK_TEXT_ROWS if self.one_chunk else pc.STREAM_TEXT_ROWS
        if self.hashes and (final or len(self.hashes) >= rows):
            out.append(Batch(*self.block_rule(), cols=self.cols, hashes=self.hashes, snippets=self.snippets,
                             tokens=self.tokens))
            self._new_columns()
        if final and out:
            out[-1].last = True
        yield from out

    def result(self, reader: Reader) -> Ingested:
        # Rejects in input order: an encoding failure is found after later lines' parse errors.
        order = {src.path: i for i, src in enumerate(self.sources)}
        self.rejects.sort(key=lambda x: (order.get(x["source_file"], len(order)), x["source_line"]))
        ident = self.ident or self.encoder.identity()
        tokenizer_stats = merge_stats([*self.stats, self.encoder.stats()])
        if self.pool is not None:
            tokenizer_stats.update(self.pool.counters())
        bs, rule = reader.block_rule()
        infer = self.infer
        return Ingested(
            rejects=self.rejects, read=reader.read, sources=self.sources, shapes=reader.shapes,
            block_size=bs, hit_rule=rule, tokenizer_id=ident.id if ident else "none",
            template_version=ident.template_version if ident else "none",
            approximate_template=bool(ident and ident.approximate_template), tokenizer_stats=tokenizer_stats,
            input_ordered=reader.ordered, prompt_check=self.prompt_check, detector=self.detector,
            conversations_inferred=infer.inferred if infer is not None else 0,
            conversations_continued=infer.continued if infer is not None else 0, fields=reader.fields,
            read_notes=reader.clock_notes())
