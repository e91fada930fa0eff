"""Deterministic synthetic request logs with ground truth.

`generate(config)` yields request records (OpenAI chat bodies with flat metadata) in arrival order;
`generate_with_truth` pairs each with its ground-truth record; `generate_mooncake` yields Mooncake trace
lines; `write(config, path, fmt)` streams any of them to disk with a ground-truth sidecar. The same config
always gives byte-identical files.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from prefixscan.run.atomic import refuse_existing, replacing
from prefixscan.synth.breakers import REGISTRY, BreakerKind, register
from prefixscan.synth.config import FORMATS, SynthConfig, parse_breakers, parse_scenarios
from prefixscan.synth.engine import Engine
from prefixscan.synth.mooncake import BlockMapper, mooncake_record
from prefixscan.synth.scenarios import SCENARIOS
from prefixscan.synth.truth import fields_only, render, request_id, truth
from prefixscan.synth.writers import open_sink

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
        return {"path": self.path, "truth_path": self.truth_path, "format": self.format,
                "requests": self.requests, "conversations": self.conversations, "fields": self.fields,
                "by_scenario": self.by_scenario, "by_tenant": self.by_tenant,
                "fields_by_kind": self.fields_by_kind, "blocks": self.blocks, "hit_blocks": self.hit_blocks,
                "block_hit_rate": round(self.block_hit_rate, 6), "bytes": self.bytes}


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
