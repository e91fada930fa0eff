"""Ingest: logs -> records -> tokens -> chained block hashes, collected as the requests input columns.

Records stream through in batches (memory bounded by a batch plus the per-request block hashes). Every
record read ends up either accepted or in the rejects list with its file, line and reason.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixscan.config import AnalyzeConfig
from prefixscan.encode import (
    DEPTH,
    EncodePool,
    Hashed,
    LazyTokenizer,
    RecordEncoder,
    Rejected,
    auto_workers,
    merge_stats,
    root_of,
    shared_chain_cache,
)
from prefixscan.errors import InputError, RejectError, UsageError
from prefixscan.hashing import mix_ids, mix_ids_per
from prefixscan.io.mooncake_fast import iter_chunks
from prefixscan.io.readers import Position, RawError, parse_line, read_jsonl, read_source
from prefixscan.io.shapes import FIELDS, FORMATS, Record, RecordError, detect, normalise
from prefixscan.io.sources import Source, expand
from prefixscan.render import content_text
from prefixscan.tracecols import TraceColumns

BATCH = 512
POOL_BATCH = 256  # with encode workers: finer jobs keep both sides busy and fewer records in flight
FAST_MOONCAKE = True  # the compiled Mooncake reader; tests switch it off to compare with the ordinary path
TRACE_BLOCK = {"mooncake": 512, "bailian": 16}


@dataclass
class Ingested:
    """Accepted requests in input order, rejects, and what the summary says about the input."""

    cols: dict[str, list[Any]]
    hashes: list[np.ndarray]
    tokens: list[np.ndarray] | None
    snippets: list[str]
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
    detector: Any = None  # prefixscan.detect.Detector when findings are on (fed below, finalised in analysis)
    conversations_inferred: int = 0  # chat requests given an inferred conversation id
    conversations_continued: int = 0  # of those, requests found to continue an earlier request
    # Hashed traces arrive as arrays instead of `cols`/`hashes` lists: the ingest columns as a frame,
    # plus the CSR blocks (offsets into the namespaced hashes).
    frame: Any = None
    offsets: np.ndarray | None = None
    flat: np.ndarray | None = None


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


COLS = ("request_id", "source_file", "source_line", "timestamp_s", "tenant", "conversation_id",
        "conversation_inferred", "user", "model", "adapter", "cache_salt", "replica", "category", "turn_index",
        "prompt_tokens", "head_tokens", "output_tokens", "actual_cached_tokens", "namespace")


def _user_turns(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "user")


def _snippet(r: Record) -> str:
    """Where the prompt starts, kept in memory only; redacted when a prefixes row shows it."""
    if r.messages:
        return " | ".join(content_text(m.get("content"))[:80] for m in r.messages[:2])
    return (r.prompt or "")[:160]


@dataclass
class Batch:
    """Consecutive accepted requests (input order) handed to a streaming consumer: the ingest columns as
    lists (`cols`, `hashes`, `snippets`) or, for hashed traces, as a frame with CSR blocks."""

    block_size: int
    hit_rule: str
    cols: dict[str, list[Any]]
    hashes: list[np.ndarray]
    snippets: list[str]
    frame: Any = None
    offsets: np.ndarray | None = None
    flat: np.ndarray | None = None
    tokens: None = None


STREAM_TEXT_ROWS = 4096  # text requests per Batch (each carries hundreds of blocks)
STREAM_TRACE_ROWS = 65536  # hashed-trace requests per Batch on the ordinary path (the compiled one: a chunk)


def ingest(cfg: AnalyzeConfig, progress: Callable[[int, int, int], None] | None = None,
           sink: Callable[[Batch], None] | None = None, sources: list[Source] | None = None,
           encoder: RecordEncoder | None = None) -> Ingested:
    """Read every input, reject what is malformed, tokenise and hash what is not.

    With a `sink`, accepted requests are handed over in input-order Batches as they are ready and not
    kept: the returned Ingested then carries only the rejects and what the summary says about the input.
    `sources`: the inputs already expanded (`io.sources.expand`), so a caller that looked at them first
    does not fingerprint every file twice. `encoder`: encodes text records in this process instead of
    a RecordEncoder and worker processes (the Ray engine's, which looks up what the cluster encoded)."""
    if cfg.order not in ("time", "input"):
        raise UsageError(f"--order must be time or input, not {cfg.order!r}")
    if cfg.format not in FORMATS:
        raise UsageError(f"unknown --format {cfg.format!r}; choose one of {', '.join(FORMATS)}")
    bad = [k for k, _ in cfg.fields if k not in FIELDS]
    if bad:
        raise UsageError(f"unknown --field name(s) {', '.join(bad)}; known: {', '.join(FIELDS)}")
    overrides = dict(cfg.fields)
    sources = sources if sources is not None else expand(list(cfg.inputs))
    cols: dict[str, list[Any]] = {c: [] for c in COLS}
    hashes: list[np.ndarray] = []
    keep_tokens = cfg.granularity == "token"
    tokens_out: list[np.ndarray] | None = [] if keep_tokens else None
    snippets: list[str] = []
    rejects: list[dict[str, Any]] = []
    seen_ids: set[str] = set()
    prompt_check = PromptCheck()
    ordered = 0  # records timed by input order
    shapes: dict[str, str] = {}
    read = 0
    mode: str | None = None  # "tokens" or a trace name; runs cannot mix block sizes
    bailian_roots: dict[Any, Any] = {}
    _mix_traces = _trace_mixer(cfg)
    trace = TraceColumns()
    # Text records are encoded here or, on large inputs, by worker processes (encode.py) while this
    # process reads on; their results are taken in submission order, DEPTH batches behind the reading.
    n_workers = auto_workers(cfg, sum(s.size for s in sources)) if encoder is None else 0
    encoder = encoder if encoder is not None else RecordEncoder(cfg, keep_tokens)
    pool: EncodePool | None = None
    pending: deque[list[Record]] = deque()
    ident, stats = None, []  # the workers' tokenizer identity and counters, once they are closed
    # Findings: the detector sees each accepted chat record once, here (no second pass over the logs).
    detector = None
    if cfg.findings:
        from prefixscan.detect import Detector

        detector = Detector(cfg.block_size)
        detector.chains = shared_chain_cache(1.0, cfg)  # its rewrites hash as the run does (--hash)
    infer = None
    if cfg.infer_conversations:
        from prefixscan.reuse.conversations import ConversationInference

        infer = ConversationInference()

    def reject(src: str, line: int, reason: str, detail: str) -> None:
        if cfg.strict:  # an earlier record may fail to encode: report the first bad record in the file
            flush(batch)
            drain()
        rejects_append(src, line, reason, detail)

    def accept_encoded(texty: list[Record], results: list[Hashed | Rejected]) -> None:
        """Encoded records into the columns (or the rejects), in input order; the detector sees them."""
        for r, e in zip(texty, results, strict=True):
            if isinstance(e, Rejected):
                rejects_append(r.source_file, r.source_line, e.reason, e.detail)
                continue
            if r.turn_index is None and r.messages:
                r.turn_index = _user_turns(r.messages) - 1 if _user_turns(r.messages) else None
            inferred = infer is not None and r.conversation_id is None and bool(r.messages)
            if inferred:
                r.conversation_id = infer.assign(r.request_id, r.tenant, r.model, r.messages)  # type: ignore[union-attr]
            cols["conversation_inferred"].append(inferred)
            for c in COLS:
                if c in ("prompt_tokens", "head_tokens", "namespace", "conversation_inferred"):
                    continue
                cols[c].append(getattr(r, c))
            cols["prompt_tokens"].append(e.n_tokens)
            prompt_check.add(r.reported_prompt_tokens, e.n_tokens)
            cols["head_tokens"].append(e.head_tokens)
            cols["namespace"].append(e.root)
            hashes.append(e.hashes)
            snippets.append(_snippet(r))
            if tokens_out is not None:
                tokens_out.append(e.tokens)
            if detector is not None and r.kind == "chat":
                detector.feed(r, e.root)
        if detector is None:
            return
        if pool is None:
            detector.flush(encoder.load())
        elif detector.pending:  # with workers, a worker tokenises and hashes the rewrites as well
            pool.submit("rewrite", detector.take_pending())

    def rejects_append(src: str, line: int, reason: str, detail: str) -> None:
        if cfg.strict:
            raise RejectError(f"{src}:{line}: {reason}: {detail} (run without --strict to collect rejects)")
        rejects.append({"source_file": src, "source_line": line, "reason": reason, "detail": detail})

    def take_one() -> None:
        """Take the oldest job's results back from the workers."""
        kind, results = pool.collect()  # type: ignore[union-attr]
        if kind == "encode":
            accept_encoded(pending.popleft(), results)
        else:
            for rid, parts, n in results:
                detector.put_rewritten(rid, parts, n)  # type: ignore[union-attr]

    def drain() -> None:
        while pool is not None and pool.inflight:
            take_one()

    def flush(batch: list[Record]) -> None:
        nonlocal pool
        if not batch:
            return
        hashed = [r for r in batch if r.kind == "hashed"]
        if hashed:  # traces are kept as arrays (no per-request lists); runs cannot mix them with text
            trace.add_records(hashed, *_mix_traces(hashed))
        texty = [r for r in batch if r.kind != "hashed"]
        batch.clear()
        if not texty:
            return
        if not n_workers:
            accept_encoded(texty, encoder.encode(texty))
            return
        if pool is None:
            pool = stack.enter_context(EncodePool(cfg, keep_tokens, n_workers, encoder))
            if detector is not None:  # for the findings' token offsets and late rewrites, loaded if needed
                detector.tokenizer = LazyTokenizer(encoder.load)
        pool.submit("encode", texty)
        pending.append(texty)
        while pool.inflight > DEPTH:
            take_one()

    batch: list[Record] = []
    total_bytes = sum(s.size for s in sources)
    done_bytes = 0
    pos = Position()
    stack = ExitStack()  # stops the encode workers if reading fails

    def set_mode(this_mode: str, where: str) -> None:
        nonlocal mode
        if mode is None:
            mode = this_mode
        elif mode != this_mode:
            raise InputError(f"{where}: cannot mix {this_mode} records with {mode} records in "
                             "one run (their block sizes differ); analyze them separately")

    def block_rule() -> tuple[int, str]:
        is_trace = mode in TRACE_BLOCK
        return ((cfg.hash_block_size or TRACE_BLOCK[mode]) if is_trace else cfg.block_size,  # type: ignore[index]
                "trace" if is_trace else "vllm")

    def emit(final: bool = False, chunk_done: bool = False) -> None:
        """Hand what is collected to the sink: a trace every compiled chunk (or STREAM_TRACE_ROWS
        requests), text every STREAM_TEXT_ROWS requests, and whatever is left at the end."""
        nonlocal trace, cols, hashes, snippets
        if sink is None:
            return
        if trace.n and (final or chunk_done or trace.n >= STREAM_TRACE_ROWS):
            frame, off, flat = trace.finish()
            trace = TraceColumns()
            sink(Batch(*block_rule(), cols={}, hashes=[], snippets=[], frame=frame, offsets=off, flat=flat))
        if hashes and (final or len(hashes) >= STREAM_TEXT_ROWS):
            out = Batch(*block_rule(), cols=cols, hashes=hashes, snippets=snippets)
            cols, hashes, snippets = {c: [] for c in COLS}, [], []
            sink(out)

    def accept(src: Source, line: int, obj: dict[str, Any] | RawError, shape: str | None) -> Record | None:
        """The ordinary path for one parsed line: a Record, or None after rejecting it."""
        if isinstance(obj, RawError):
            reject(src.path, line, obj.reason, obj.detail)
            return None
        try:
            rec = normalise(obj, shape or detect(obj), src.path, line, overrides, bailian_roots)
        except RecordError as exc:
            reject(src.path, line, exc.reason, exc.detail)
            return None
        if rec.request_id in seen_ids:
            reject(src.path, line, "duplicate_id",
                   f"request id {rec.request_id!r} already seen; the first occurrence is kept")
            return None
        seen_ids.add(rec.request_id)
        if cfg.order == "input" or rec.timestamp_s != rec.timestamp_s:  # NaN: a shape with no clock
            nonlocal ordered
            rec.timestamp_s = float(ordered)
            ordered += 1
        set_mode(shape if rec.kind == "hashed" else "tokens", f"{src.path}:{line}")  # type: ignore[arg-type]
        return rec

    def fast_mooncake(src: Source) -> None:
        """A Mooncake JSONL file through the compiled reader; odd lines take the ordinary path."""
        nonlocal read
        flush(batch)  # earlier files' records first: input order is analysis order for equal times
        drain()
        root = _mooncake_root(cfg, src.path)
        for chunk in iter_chunks(src.path, pos):
            read += chunk.non_blank
            if len(chunk.line):
                set_mode("mooncake", f"{src.path}:{int(chunk.line[0])}")
                trace.add(src.path, chunk.line, chunk.timestamp_ms / 1000.0, chunk.input_length, np.uint64(root),
                          chunk.lengths, mix_ids(chunk.ids, root), ints={"output_tokens": chunk.output_length})
            for line, raw in chunk.slow:
                obj = raw if isinstance(raw, RawError) else parse_line(raw)  # RawError: a damaged file
                if obj is None:
                    read -= 1
                    continue
                rec = accept(src, line, obj, "mooncake")
                if rec is not None:
                    batch.append(rec)
            flush(batch)
            emit(chunk_done=True)
            if progress is not None:
                progress(read, done_bytes + pos.bytes, total_bytes)

    with stack:
        for src in sources:
            shape = None if cfg.format == "auto" else cfg.format
            if shape is None and "messages" in overrides:  # the prompt is where --field says: a chat record
                shape = "chat"
            elif shape is None and "prompt" in overrides:
                shape = "completion"
            pos.bytes = 0
            if FAST_MOONCAKE and src.kind == "jsonl" and not overrides and (shape or _peek_shape(src)) == "mooncake":
                shapes[src.path] = "mooncake"
                fast_mooncake(src)
                done_bytes += src.size
                continue
            for line, obj in read_source(src, pos):
                read += 1
                if progress is not None and read % 1000 == 0:
                    progress(read, done_bytes + pos.bytes, total_bytes)
                if shape is None and isinstance(obj, dict):
                    try:
                        shape = detect(obj)
                        shapes[src.path] = shape
                    except RecordError as exc:
                        reject(src.path, line, exc.reason, exc.detail)
                        continue
                rec = accept(src, line, obj, shape)
                if rec is None:
                    continue
                batch.append(rec)
                if len(batch) >= (POOL_BATCH if n_workers else BATCH):
                    flush(batch)
                    emit()
            if shape is not None:
                shapes.setdefault(src.path, shape)
            done_bytes += src.size
        flush(batch)
        drain()
        emit(final=True)
        if pool is not None:
            ident, stats = pool.close()
    if progress is not None:
        progress(read, total_bytes, total_bytes)
    # Rejects in input order: an encoding failure is found after later lines' parse errors.
    order = {src.path: i for i, src in enumerate(sources)}
    rejects.sort(key=lambda x: (order.get(x["source_file"], len(order)), x["source_line"]))
    ident = ident or encoder.identity()
    tokenizer_stats = merge_stats([*stats, encoder.stats()])
    if pool is not None:
        tokenizer_stats.update(pool.counters())
    bs, rule = block_rule()
    frame = offsets = flat = None
    if trace.n:
        frame, offsets, flat = trace.finish()
        snippets = []  # hashed traces carry no text
    return Ingested(
        frame=frame, offsets=offsets, flat=flat,
        cols=cols, hashes=hashes, tokens=tokens_out, snippets=snippets, rejects=rejects, read=read,
        sources=sources, shapes=shapes, block_size=bs, hit_rule=rule,
        tokenizer_id=ident.id if ident else "none",
        template_version=ident.template_version if ident else "none",
        approximate_template=bool(ident and ident.approximate_template),
        tokenizer_stats=tokenizer_stats,
        input_ordered=ordered, prompt_check=prompt_check,
        detector=detector,
        conversations_inferred=infer.inferred if infer is not None else 0,
        conversations_continued=infer.continued if infer is not None else 0,
    )


def _mooncake_root(cfg: AnalyzeConfig, path: str) -> int:
    """The namespace of a canonical Mooncake line: a record with no model, adapter, salt or tenant."""
    return _trace_root(cfg, Record(source_file=path, source_line=0, request_id="", timestamp_s=0.0,
                                   kind="hashed"))


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


def _trace_root(cfg: AnalyzeConfig, r: Record) -> int:
    """A hashed-trace record's namespace. Each trace file has its own id space (REFERENCE.md 8): the file
    is part of the namespace."""
    return root_of(cfg, r, "trace", f"trace:{r.source_file}")


def _trace_mixer(cfg: AnalyzeConfig) -> Callable[[list[Record]], tuple[np.ndarray, np.ndarray]]:
    """Namespace a batch of hashed-trace records in one vectorised call (per-request numpy calls dominated):
    (root per record, their namespaced ids concatenated in order)."""
    roots: dict[tuple[Any, ...], int] = {}

    def mix(recs: list[Record]) -> tuple[np.ndarray, np.ndarray]:
        rs = []
        for r in recs:
            key = (r.model, r.adapter, r.cache_salt, r.tenant if cfg.isolate_tenants else None, r.source_file)
            root = roots.get(key)
            if root is None:
                root = roots[key] = _trace_root(cfg, r)
            rs.append(root)
        ids = [r.hash_ids if r.hash_ids is not None else np.zeros(0, np.int64) for r in recs]
        root_arr = np.asarray(rs, dtype=np.uint64)
        return root_arr, mix_ids_per(np.concatenate(ids), np.repeat(root_arr, [len(x) for x in ids]))

    return mix
