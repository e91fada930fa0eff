"""Streaming readers: yield (line or row number, raw record or error) without holding the file.

JSONL is read line by line (plain or gzip); Parquet in record batches. Memory stays bounded by one batch
whatever the file size.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import orjson

from prefixscan.io.ecosystem import expand_otlp
from prefixscan.io.sources import Source

BATCH_ROWS = 8192


class Position:
    """Bytes of the current file consumed so far (compressed bytes for gzip), for progress bars."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class RawError:
    """A record that could not even be parsed; becomes a reject."""

    __slots__ = ("reason", "detail")

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail


def open_bytes(path: str):  # noqa: ANN201 - a binary file object
    """The file for reading bytes, decompressed when it is gzip (by its magic, not its name)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    # 1 MiB buffer: chat log lines are tens of KB, and the default 8 KiB buffer made line reading a
    # quarter slower
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb", buffering=1 << 20)


def parse_line(line: bytes) -> dict[str, Any] | RawError | None:
    """One JSONL line: the object, a RawError saying why it is not one, or None for a blank line."""
    if not line.strip():
        return None
    try:
        obj = orjson.loads(line)  # checks UTF-8 itself: the line is decoded again only to say why it failed
    except orjson.JSONDecodeError as exc:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as bad:
            return RawError("invalid_utf8", f"byte offset {bad.start} in the line")
        return RawError("invalid_json", str(exc)[:200])
    if not isinstance(obj, dict):
        return RawError("not_an_object", f"line holds a JSON {type(obj).__name__}")
    return obj


def read_jsonl(path: str, pos: Position | None = None) -> Iterator[tuple[int, dict[str, Any] | RawError]]:
    """Yield (1-based line number, parsed object or RawError); blank lines are skipped, not records."""
    with open_bytes(path) as f:
        raw = getattr(f, "fileobj", None) or f
        for lineno, line in enumerate(f, start=1):
            if pos is not None and lineno % 1024 == 0:
                pos.bytes = raw.tell()
            obj = parse_line(line)
            if obj is None:
                continue
            spans = expand_otlp(obj) if isinstance(obj, dict) and "resourceSpans" in obj else None
            if spans is None:
                yield lineno, obj
                continue
            if not spans:
                yield lineno, RawError("empty_otlp_batch", "an OTLP export line with no spans")
            for span in spans:  # an OTLP JSON export: every span of the line is a record of that line
                yield lineno, span


def read_parquet(path: str, pos: Position | None = None) -> Iterator[tuple[int, dict[str, Any] | RawError]]:
    """Yield (1-based row number, row as a dict) batch by batch."""
    import os

    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    rows = max(pf.metadata.num_rows, 1)
    size = os.path.getsize(path)
    row = 0
    for batch in pf.iter_batches(batch_size=BATCH_ROWS):
        if pos is not None:
            pos.bytes = int(size * row / rows)
        for rec in batch.to_pylist():
            row += 1
            yield row, rec


def read_source(src: Source, pos: Position | None = None) -> Iterator[tuple[int, dict[str, Any] | RawError]]:
    """Dispatch on the source kind."""
    if src.kind == "parquet":
        return read_parquet(src.path, pos)
    return read_jsonl(src.path, pos)
