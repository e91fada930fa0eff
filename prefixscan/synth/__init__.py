"""Deterministic synthetic request logs with ground truth.

`generate(config)` yields request records (OpenAI chat bodies with flat metadata) in arrival order;
`generate_with_truth` pairs each with its ground-truth record; `generate_mooncake` yields Mooncake trace
lines; `write(config, path, fmt)` streams any of them to disk with a ground-truth sidecar. The same config
always gives byte-identical files.

The request record is exactly what `analyze` reads (an OpenAI chat body with flat metadata). The truth
record says what the generator knows and a detector must rediscover: the scenario, the shared content a
request reuses, and every dynamic field with the message and character offset where it sits.

Every sink (JSONL, gzip JSONL, Parquet in row groups, Mooncake JSONL) writes as records arrive, so memory
stays flat however many requests are generated, and every sink is byte-deterministic (gzip without a
timestamp or file name in its header).
"""

from __future__ import annotations

import gc
import gzip
import os
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from prefixscan.run.atomic import refuse_existing, replacing
from prefixscan.synth.breakers import REGISTRY, BreakerKind, register
from prefixscan.synth.config import FORMATS, SynthConfig, parse_breakers, parse_scenarios
from prefixscan.synth.engine import Engine
from prefixscan.synth.mooncake import BlockMapper, mooncake_record
from prefixscan.synth.plan import Plan
from prefixscan.synth.scenarios import SCENARIOS

__all__ = [
    "FORMATS", "REGISTRY", "SCENARIOS", "BreakerKind", "SynthConfig", "SynthResult", "generate",
    "generate_mooncake", "generate_with_truth", "parse_breakers", "parse_scenarios", "register", "write",
]


@dataclass
class SynthResult:
    """What `write` produced: paths, counts, and the ideal-cache reuse of the generated workload."""

    path: str
    truth_path: str | None
    format: str
    requests: int = 0
    conversations: int = 0
    fields: int = 0
    by_scenario: dict[str, int] = field(default_factory=dict)
    by_tenant: dict[str, int] = field(default_factory=dict)
    fields_by_kind: dict[str, int] = field(default_factory=dict)
    blocks: int = 0
    hit_blocks: int = 0
    bytes: int = 0

    @property
    def block_hit_rate(self) -> float:
        """Infinite-cache block-weighted hit rate of the (estimated) 512-token blocks."""
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["block_hit_rate"] = round(self.block_hit_rate, 6)
        out["bytes"] = out.pop("bytes")  # last, after the rate
        return out


def iso_ms(epoch: float) -> str:
    """ISO-8601 UTC with milliseconds, e.g. 2026-11-29T10:15:00.123Z."""
    total_ms = int(round(epoch * 1000))
    sec, ms = divmod(total_ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{ms:03d}Z"


def request_id(seq: int, prefix: str = "") -> str:
    return f"{prefix}req-{seq + 1:06d}"


def render(plan: Plan, seq: int, epoch: float, prefix: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """The request record and its ground-truth record."""
    messages = [{"role": role, "content": parts[0].text if len(parts) == 1 else "".join(p.text for p in parts)}
                for role, parts in plan.messages]
    fields = fields_only(plan)
    rid = request_id(seq, prefix)
    record: dict[str, Any] = {
        "request_id": rid, "timestamp": iso_ms(epoch + plan.time), "tenant": plan.tenant,
        "conversation_id": None if plan.conversation_id is None else prefix + plan.conversation_id,
        "user": plan.user, "model": plan.model, "messages": messages,
        "tools": None if plan.tools is None else plan.tools.tools, "max_tokens": plan.max_tokens,
        "output_tokens": plan.output_tokens}
    for key in ("conversation_id", "tools"):  # absent, not null, when the plan has none
        if record[key] is None:
            del record[key]
    return record, truth(plan, rid, fields, prefix)


def truth(plan: Plan, rid: str, fields: list[dict[str, Any]], prefix: str = "") -> dict[str, Any]:
    """The ground-truth sidecar line for one request."""
    out = {
        "request_id": rid,
        "scenario": plan.scenario,
        "tenant": plan.tenant,
        "conversation_id": None if plan.conversation_id is None else prefix + plan.conversation_id,
        "turn_index": plan.turn_index,
        "template_id": plan.template_id,
        "shared_prefix": plan.shared,
        "fields": fields,
    }
    if plan.drift is not None:
        out["drift"] = plan.drift  # only when drift is configured, so older outputs stay byte-identical
    return out


def fields_only(plan: Plan) -> list[dict[str, Any]]:
    """Field truth without building message text (for the Mooncake path, where no text is written)."""
    out = []
    for i, (role, parts) in enumerate(plan.messages):
        pos = 0
        for p in parts:
            f = p.field
            if f is not None:
                out.append({"kind": f.kind, "source": f.source, "message_index": i, "role": role,
                            "char_offset": pos + f.offset, "value": f.value, "label": f.label,
                            "form": f.form, "position": f.position})
            pos += len(p.text)
    return out


def generate_with_truth(config: SynthConfig) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(request record, ground-truth record) pairs in arrival order."""
    engine = Engine(config)
    for seq, plan in enumerate(engine.plans()):
        yield render(plan, seq, engine.epoch, config.id_prefix)


def generate(config: SynthConfig) -> Iterator[dict[str, Any]]:
    """Request records in arrival order (see docs/synth.md for the record format)."""
    for record, _ in generate_with_truth(config):
        yield record


def generate_mooncake(config: SynthConfig, block: int = 512) -> Iterator[dict[str, Any]]:
    """Mooncake trace lines (relative ms timestamp, lengths, chained block ids) in arrival order."""
    mapper = BlockMapper(block)
    for plan in Engine(config).plans():
        length, ids = mapper.map(plan)
        yield mooncake_record(plan, length, ids)


def write(config: SynthConfig, path: str, fmt: str = "jsonl", truth_path: str | None = "",
          force: bool = True) -> SynthResult:
    """Stream a synthetic log to `path` in `fmt` plus a ground-truth sidecar.

    `truth_path` "" means `path + ".truth.jsonl"`; None writes no sidecar. With `force` False an existing
    log or sidecar is refused (UsageError) before either is written (the CLI's default: a real log must
    never be replaced by a synthetic one by mistake).
    """
    from prefixscan.errors import UsageError

    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")
    if truth_path == "":
        truth_path = path + ".truth.jsonl"
    if truth_path is not None and os.path.abspath(truth_path) == os.path.abspath(path):
        raise UsageError("--truth must differ from the output path")
    engine = Engine(config)
    mapper = BlockMapper()
    result = SynthResult(path=path, truth_path=truth_path, format=fmt)
    # Generation allocates millions of short-lived acyclic objects; frequent cyclic GC passes over the
    # long-lived prefix trie cost ~10 % of the run, so `_write_all` collects less often while writing.
    # Both files are written under temporary names and renamed when complete (run/atomic.py); not flushed
    # to disk first: a synthetic log is cheap to make again, and bench logs are gigabytes.
    if not force:
        for target in (path, truth_path):
            if target is not None:
                refuse_existing(target, force)
    truth_ctx = replacing(truth_path, durable=False) if truth_path is not None else nullcontext()
    with replacing(path, durable=False) as tmp, truth_ctx as tmp_truth:
        _write_all(engine, mapper, config, fmt, str(tmp), tmp_truth, result)
    result.blocks, result.hit_blocks = mapper.total_blocks, mapper.hit_blocks
    result.bytes = os.path.getsize(path)
    return result


def _write_all(engine: Engine, mapper: BlockMapper, config: SynthConfig, fmt: str, path: str,
               truth_path: Path | None, result: SynthResult) -> None:
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], 50_000), *thresholds[1:])
    sink = open_sink(path, fmt)
    truth_f = open(truth_path, "wb") if truth_path is not None else None
    opts = orjson.OPT_APPEND_NEWLINE
    try:
        for seq, plan in enumerate(engine.plans()):
            length, ids = mapper.map(plan)
            if fmt == "mooncake":
                sink.write(mooncake_record(plan, length, ids))
                truth_rec = (truth(plan, request_id(seq, config.id_prefix), fields_only(plan), config.id_prefix)
                             if truth_f else None)
            else:
                record, truth_rec = render(plan, seq, engine.epoch, config.id_prefix)
                sink.write(record)
            if truth_f is not None and truth_rec is not None:
                truth_f.write(orjson.dumps(truth_rec, option=opts))
            _count(result, plan, truth_rec)
    finally:
        gc.set_threshold(*thresholds)
        sink.close()
        if truth_f is not None:
            truth_f.close()


def _count(result: SynthResult, plan: Any, truth_rec: dict[str, Any] | None) -> None:
    result.requests += 1
    result.by_scenario[plan.scenario] = result.by_scenario.get(plan.scenario, 0) + 1
    result.by_tenant[plan.tenant] = result.by_tenant.get(plan.tenant, 0) + 1
    if plan.conversation_id is not None and plan.turn_index == 0:
        result.conversations += 1
    if truth_rec is not None:
        for f in truth_rec["fields"]:
            result.fields += 1
            result.fields_by_kind[f["kind"]] = result.fields_by_kind.get(f["kind"], 0) + 1


class JsonlSink:
    """One JSON object per line; gzip-compressed when `gz`."""

    def __init__(self, path: str, gz: bool = False) -> None:
        self._raw: IO[bytes] = open(path, "wb")  # closed in close()
        self._f: gzip.GzipFile | IO[bytes] = (gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)
                              if gz else self._raw)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))

    def close(self) -> None:
        if self._f is not self._raw:
            self._f.close()
        self._raw.close()


class ParquetSink:
    """Request records as Parquet: messages as list<struct<role, content>>, tools as a JSON string."""

    def __init__(self, path: str, row_group: int = 2000) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa = pa
        self.schema = pa.schema([
            ("request_id", pa.string()), ("timestamp", pa.string()), ("tenant", pa.string()),
            ("conversation_id", pa.string()), ("user", pa.string()), ("model", pa.string()),
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("tools", pa.string()), ("max_tokens", pa.int32()), ("output_tokens", pa.int32()),
        ])
        self.columns = tuple(self.schema.names)
        self._writer = pq.ParquetWriter(path, self.schema, compression="zstd")
        self._row_group = row_group
        self._rows: dict[str, list[Any]] = {c: [] for c in self.columns}

    def write(self, record: dict[str, Any]) -> None:
        rows = self._rows
        for c in self.columns:
            value = record.get(c)
            if c == "tools" and value is not None:
                value = orjson.dumps(value).decode()
            rows[c].append(value)
        if len(rows["request_id"]) >= self._row_group:
            self._flush()

    def _flush(self) -> None:
        if not self._rows["request_id"]:
            return
        table = self._pa.Table.from_pydict(self._rows, schema=self.schema)
        self._writer.write_table(table)
        self._rows = {c: [] for c in self.columns}

    def close(self) -> None:
        self._flush()
        self._writer.close()


def open_sink(path: str, fmt: str) -> JsonlSink | ParquetSink:
    """The sink for a format name: jsonl, jsonl.gz, parquet or mooncake (a JSONL of trace lines)."""
    return ParquetSink(path) if fmt == "parquet" else JsonlSink(path, gz=fmt == "jsonl.gz")
