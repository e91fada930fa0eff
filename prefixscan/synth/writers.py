"""Streaming sinks: JSONL, gzip JSONL, Parquet (row groups) and Mooncake JSONL.

Every sink writes as records arrive, so memory stays flat however many requests are generated, and
every sink is byte-deterministic (gzip without a timestamp or file name in its header).
"""

from __future__ import annotations

import gzip
from typing import IO, Any

import orjson

_OPTS = orjson.OPT_APPEND_NEWLINE


class JsonlSink:
    """One JSON object per line; gzip-compressed when `gz`."""

    def __init__(self, path: str, gz: bool = False) -> None:
        self._raw: IO[bytes] = open(path, "wb")  # closed in close()
        self._f: gzip.GzipFile | IO[bytes] = (gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)
                              if gz else self._raw)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(orjson.dumps(record, option=_OPTS))

    def close(self) -> None:
        if self._f is not self._raw:
            self._f.close()
        self._raw.close()


class ParquetSink:
    """Request records as Parquet: messages as list<struct<role, content>>, tools as a JSON string."""

    COLUMNS = ("request_id", "timestamp", "tenant", "conversation_id", "user", "model", "messages", "tools",
               "max_tokens", "output_tokens")

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
        self._writer = pq.ParquetWriter(path, self.schema, compression="zstd")
        self._row_group = row_group
        self._rows: dict[str, list[Any]] = {c: [] for c in self.COLUMNS}

    def write(self, record: dict[str, Any]) -> None:
        rows = self._rows
        for c in self.COLUMNS:
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
        self._rows = {c: [] for c in self.COLUMNS}

    def close(self) -> None:
        self._flush()
        self._writer.close()


def open_sink(path: str, fmt: str) -> JsonlSink | ParquetSink:
    """The sink for a format name: jsonl, jsonl.gz, parquet or mooncake (a JSONL of trace lines)."""
    if fmt == "parquet":
        return ParquetSink(path)
    return JsonlSink(path, gz=fmt == "jsonl.gz")
