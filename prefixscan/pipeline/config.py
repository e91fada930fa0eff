"""The pipeline's settings: option checks, whether a log streams, and the batch sizes of its stages.

The stages read these constants through this module at run time (tests shrink them to exercise every
chunk boundary); the options themselves are `prefixscan.config.AnalyzeConfig`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import orjson

from prefixscan.config import AnalyzeConfig
from prefixscan.encode import ray_check
from prefixscan.encode.vllm_hash import check_hash_options
from prefixscan.errors import UsageError
from prefixscan.read.latency import conflicting
from prefixscan.read.record import RecordError
from prefixscan.read.shapes import FIELDS, FORMATS, detect
from prefixscan.read.sources import Source

BATCH = 512  # records per encode call in this process
POOL_BATCH = 256  # with encode workers: finer jobs keep both sides busy and fewer records in flight
STREAM_TEXT_ROWS = 4096  # text requests per Batch (each carries hundreds of blocks)
# ... of a log taken as one chunk, reused as it comes (pipeline/reuse_feed.py): smaller, as the last two
# Batches' reuse is what is left when the encoding ends (a Batch's rows are held back until the next comes)
ONE_CHUNK_TEXT_ROWS = 1024
STREAM_TRACE_ROWS = 65536  # hashed-trace requests per Batch on the ordinary path (the compiled one: a chunk)
FAST_MOONCAKE = True  # the compiled Mooncake reader; tests switch it off to compare with the ordinary path
TRACE_BLOCK = {"mooncake": 512, "bailian": 16}
STREAM_MIN_BYTES = 256 << 20  # smaller logs are analysed as one chunk, where they run faster
_PACKED = {".gz": 8, ".parquet": 4}  # rough expansion of compressed inputs when judging their size


def validate(cfg: AnalyzeConfig) -> None:
    """Options checked before anything is read: a one-line UsageError for the first bad one."""
    if cfg.block_size < 1:
        raise UsageError(f"--block-size must be >= 1, got {cfg.block_size}")
    if cfg.hash_block_size is not None and cfg.hash_block_size < 1:
        raise UsageError(f"--hash-block-size must be >= 1, got {cfg.hash_block_size}")
    if cfg.granularity not in ("block", "token"):
        raise UsageError(f"--granularity must be block or token, got {cfg.granularity!r}")
    if cfg.snippet_k < 1:
        raise UsageError(f"--snippet-k must be >= 1, got {cfg.snippet_k}")
    if cfg.capacities is not None and any(c <= 0 for c in cfg.capacities):
        raise UsageError("--capacities must be positive token counts")
    check_hash_options(cfg)
    if cfg.engine not in ("local", "ray"):
        raise UsageError(f"--engine must be local or ray, got {cfg.engine!r}")
    if cfg.engine == "ray":
        ray_check.check(cfg)
    _check_reuse(cfg)


def _check_reuse(cfg: AnalyzeConfig) -> None:
    """--reuse and, for sql, a memory limit DuckDB accepts and a temporary directory it can write."""
    if cfg.reuse not in ("scan", "sql"):
        raise UsageError(f"--reuse must be scan or sql, got {cfg.reuse!r}")
    if cfg.reuse != "sql":
        return
    if cfg.granularity != "block":
        raise UsageError("--reuse sql measures block granularity; drop --granularity token or use --reuse scan")
    from prefixscan.reuse.sql import check_memory_limit, check_temp_directory

    checks: list[tuple[str, Callable[[str], None], str]] = [
        ("--reuse-memory-limit", check_memory_limit, cfg.reuse_memory_limit)]
    if cfg.reuse_temp_dir is not None:
        checks.append(("--reuse-temp-dir", check_temp_directory, cfg.reuse_temp_dir))
    for flag, check, value in checks:
        try:
            check(value)
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None


def check_read_options(cfg: AnalyzeConfig) -> None:
    """The read stage's options (checked once the inputs are known to exist)."""
    if cfg.order not in ("time", "input"):
        raise UsageError(f"--order must be time or input, not {cfg.order!r}")
    if cfg.format not in FORMATS:
        raise UsageError(f"unknown --format {cfg.format!r}; choose one of {', '.join(FORMATS)}")
    bad = [k for k, _ in cfg.fields if k not in FIELDS]
    if bad:
        raise UsageError(f"unknown --field name(s) {', '.join(bad)}; known: {', '.join(FIELDS)}")
    twice = conflicting([k for k, _ in cfg.fields])
    if twice:
        raise UsageError(f"--field {'; '.join(twice)} map the same latency column: keep one (its suffix is the unit)")


def text_log(cfg: AnalyzeConfig, path: str) -> bool:
    """Whether a plain JSONL file holds text records (rendered and tokenised, so encoded by the workers),
    judged by its first line: a cheap guess, used only to decide how to run, never what is computed."""
    if cfg.format != "auto":
        return cfg.format not in TRACE_BLOCK
    if not path.lower().endswith((".jsonl", ".ndjson", ".json")) or not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
                return isinstance(obj, dict) and detect(obj) not in TRACE_BLOCK
            except (orjson.JSONDecodeError, RecordError):
                return False
    return False


class OutOfOrder(Exception):
    """The log goes back in time further than one chunk: it cannot be analysed as a stream (the reuse stage
    raises it; the run then takes the log as one chunk)."""


def streams(cfg: AnalyzeConfig, sources: list[Source]) -> bool:
    """Whether `analyze` streams the log in chunks (bounded memory) or takes it as one chunk.

    `streaming=None` (the default) streams when a run directory is written, at block granularity, and the
    input is large (STREAM_MIN_BYTES, compressed files counted at their rough expanded size) or the reuse is
    `--reuse sql`: as one
    chunk, a log takes about 8x its JSONL size; in chunks, memory grows with distinct blocks only, at some
    cost in time on small logs. Token granularity holds every prompt's tokens and is never chunked."""
    if cfg.streaming is None:
        if not cfg.output or cfg.granularity != "block":
            return False
        if cfg.reuse == "sql":  # its point is bounded memory: in one chunk it holds the log and reads it back
            return True
        size = sum(s.size * next((k for ext, k in _PACKED.items() if s.path.endswith(ext)), 1) for s in sources)
        return size >= STREAM_MIN_BYTES
    if cfg.streaming and not cfg.output:
        raise UsageError("streaming writes the requests table as it goes: give a run directory with -o")
    if cfg.streaming and cfg.granularity == "token":
        raise UsageError("--granularity token holds every prompt's tokens: it cannot stream; use --in-memory")
    return cfg.streaming
