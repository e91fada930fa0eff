"""Streaming readers: yield (line or row number, raw record or error) without holding the file.

JSONL is read line by line (plain or gzip); Parquet in record batches. Memory stays bounded by one batch
whatever the file size.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from typing import Any

import orjson

from prefixscan.io import remote
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


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PIECE = 16 << 10  # bytes decompressed per read of a zstd stream


class _Zstd(io.RawIOBase):
    """A zstd file as a raw stream (pyarrow decompresses; its stream has no readline, so it is buffered)."""

    def __init__(self, path: str) -> None:
        import pyarrow as pa

        self.fileobj = _open_raw(path)
        self._stream = pa.CompressedInputStream(pa.PythonFile(self.fileobj, mode="r"), "zstd")
        self._error: EOFError | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        """Fill `b` in small pieces, so that a damaged stream loses at most one piece before the error."""
        if self._error is not None:
            raise self._error
        n = 0
        while n < len(b):
            try:
                data = self._stream.read(min(PIECE, len(b) - n))
            except OSError as exc:  # pyarrow reports a damaged stream as an I/O error: the data's fault
                self._error = EOFError(f"zstd: {exc}")
                if n:
                    return n
                raise self._error from None
            if not data:
                break
            b[n : n + len(data)] = data
            n += len(data)
        return n

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
            self.fileobj.close()
        super().close()


def _open_raw(path: str):  # noqa: ANN202 - a binary file object
    """The file's bytes as stored: a local file, or an object in a store (`remote`), seekable."""
    return remote.open_random(path) if remote.is_uri(path) else open(path, "rb")  # noqa: SIM115


def compression(path: str) -> str | None:
    """"gzip", "zstd" or None: how a file is compressed, by its magic bytes, not its name (`fix` writes
    its output compressed the same way)."""
    with _open_raw(path) as f:
        magic = f.read(4)
    return "gzip" if magic[:2] == b"\x1f\x8b" else "zstd" if magic == ZSTD_MAGIC else None


def open_bytes(path: str):  # noqa: ANN201 - a binary file object
    """The file for reading bytes, decompressed when it is gzip or zstd (by its magic, not its name)."""
    kind = compression(path)
    # 1 MiB buffer: chat log lines are tens of KB, and the default 8 KiB buffer made line reading a
    # quarter slower
    if kind == "gzip":
        return gzip.open(_open_raw(path), "rb") if remote.is_uri(path) else gzip.open(path, "rb")
    if kind == "zstd":
        return io.BufferedReader(_Zstd(path), buffer_size=1 << 20)
    if remote.is_uri(path):
        return io.BufferedReader(_open_raw(path), buffer_size=1 << 20)
    return open(path, "rb", buffering=1 << 20)


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


# What a damaged compressed or Parquet file raises while it is read (besides pyarrow's ArrowException)
DECODE_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError)


def corrupt(what: str, exc: BaseException, rest: str = "the records before it were read, the rest was not"
            ) -> RawError:
    """The reject of a file that cannot be read on from some point: where it broke and why."""
    why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
    return RawError("corrupt_file", f"{what}: {why}; {rest}")


def read_jsonl(path: str, pos: Position | None = None) -> Iterator[tuple[int, dict[str, Any] | RawError]]:
    """Yield (1-based line number, parsed object or RawError); blank lines are skipped, not records. A file
    that cannot be decompressed to its end yields one `corrupt_file` RawError where it broke, then stops."""
    lineno = 0
    with open_bytes(path) as f:
        raw = getattr(f, "fileobj", None) or getattr(getattr(f, "raw", None), "fileobj", None) or f
        try:
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
        except DECODE_ERRORS as exc:
            kind = "zstd" if isinstance(raw, _Zstd) or getattr(f, "raw", None).__class__ is _Zstd else "gzip"
            where = f"{kind} data broken after line {lineno} (compressed byte offset {_tell(raw)})"
            yield lineno + 1, corrupt(where, exc)


def _tell(f: Any) -> str:
    try:
        return f"{f.tell():,}"
    except (OSError, ValueError):
        return "?"


def read_parquet(path: str, pos: Position | None = None) -> Iterator[tuple[int, dict[str, Any] | RawError]]:
    """Yield (1-based row number, row as a dict) batch by batch. An unreadable file (no footer, not
    Parquet) is one `corrupt_file` RawError; a damaged row group is one, and reading goes on after it."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        raw = _open_raw(path) if remote.is_uri(path) else None
        pf = pq.ParquetFile(raw if raw is not None else path)
        groups = pf.metadata.num_row_groups
        sizes = [pf.metadata.row_group(g).num_rows for g in range(groups)]
    except (pa.ArrowException, OSError, *DECODE_ERRORS) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        yield 1, corrupt("not a readable Parquet file (footer or metadata)", exc, "no record could be read")
        return
    rows = max(sum(sizes), 1)
    size = raw.size() if raw is not None else os.path.getsize(path)
    row = 0
    for g in range(groups):
        start = row
        try:
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g]):
                if pos is not None:
                    pos.bytes = int(size * row / rows)
                for rec in _rows(batch):
                    row += 1
                    yield row, rec
        except (pa.ArrowException, OSError, *DECODE_ERRORS) as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise
            yield row + 1, corrupt(f"row group {g} (rows {start + 1}-{start + sizes[g]}) cannot be decoded", exc,
                                   "its rows were not read; the other row groups were")
            row = start + sizes[g]  # the next group's rows keep their numbers


def _rows(batch: Any) -> list[dict[str, Any] | RawError]:
    """A batch as dicts; a row whose values Python cannot hold (a date beyond year 9999) is a RawError."""
    try:
        return batch.to_pylist()
    except (ValueError, OverflowError, TypeError):
        out: list[dict[str, Any] | RawError] = []
        for i in range(batch.num_rows):
            try:
                out.append(batch.slice(i, 1).to_pylist()[0])
            except (ValueError, OverflowError, TypeError) as exc:
                out.append(RawError("bad_value", f"a value cannot be read: {str(exc)[:160]}"))
        return out


def read_source(src: Source, pos: Position | None = None) -> Iterator[tuple[int, dict[str, Any] | RawError]]:
    """Dispatch on the source kind."""
    if src.kind == "parquet":
        return read_parquet(src.path, pos)
    return read_jsonl(src.path, pos)
