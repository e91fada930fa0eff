"""Streaming readers: yield (line or row number, raw record or error) without holding the file.

JSON text (plain, gzip or zstd) comes in four layouts, told apart by its first bytes (`layout`): JSON lines
(LF or CRLF), JSON lines with CR-only ends (old Mac exports), one JSON array of records (`[...]`, pretty or
on one line) and concatenated objects (`{...}{...}`, typically pretty-printed). Lines are read line by
line; arrays and concatenated objects are split into records by a byte scanner that holds one record at a
time (`split_values`), never the whole file. Parquet is read in record batches. Memory stays bounded by one
batch, or by the largest record, whatever the file size.
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from prefixscan.read import remote
from prefixscan.read.otel import expand_otlp
from prefixscan.read.sources import Source

BATCH_ROWS = 8192


@dataclass(slots=True)
class Position:
    """Bytes of the current file consumed so far (compressed bytes for gzip), for progress bars."""

    bytes: int = 0


@dataclass(slots=True)
class RawError:
    """A record that could not even be parsed; becomes a reject."""

    reason: str
    detail: str


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


def _open_raw(path: str):  # a binary file object
    """The file's bytes as stored: a local file, or an object in a store (`remote`), seekable."""
    return remote.open_random(path) if remote.is_uri(path) else open(path, "rb")


def compression(path: str) -> str | None:
    """"gzip", "zstd" or None: how a file is compressed, by its magic bytes, not its name (`fix` writes
    its output compressed the same way)."""
    with _open_raw(path) as f:
        magic = f.read(4)
    return "gzip" if magic[:2] == b"\x1f\x8b" else "zstd" if magic == ZSTD_MAGIC else None


def open_bytes(path: str):  # a binary file object
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


class RecordLoc(int):
    """Where a record of a JSON array or of concatenated objects starts: its line (the int value, as for a
    JSONL record) and its 1-based number in the file (`index`), since one line may hold many records."""

    index: int

    def __new__(cls, line: int, index: int = 0) -> RecordLoc:  # (index set again by pickle's state)
        loc = super().__new__(cls, line)
        loc.index = index
        return loc


def default_request_id(path: str, line: int) -> str:
    """The id of a record that carries none: `file:line`, and `#N` (its number) when a line may hold many."""
    return f"{path}:{int(line)}#{line.index}" if isinstance(line, RecordLoc) else f"{path}:{line}"


SNIFF = 64 << 10  # decompressed bytes read to tell a file's layout
SNIFF_MAX = 16 << 20  # ... and at most this much to find the end of a first object that spans lines


class _Limited:
    """A binary file read no further than `limit` bytes."""

    def __init__(self, f: Any, limit: int) -> None:
        self.f, self.left = f, limit

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n) if n > 0 else b""
        self.left -= len(data)
        return data
LAYOUTS = ("lines", "cr-lines", "array", "objects")


def layout(path: str) -> str:
    """How a JSON text file holds its records: "lines" (JSONL, LF or CRLF), "cr-lines" (JSONL with CR-only
    line ends), "array" (one JSON array) or "objects" (concatenated objects, e.g. pretty-printed).

    Decided on the first 64 KiB: `[` first is an array; a first line that is a whole JSON value is JSONL;
    otherwise, a first object that spans lines (or is followed by another on its line) and parses, found
    within the first 16 MiB, is concatenated objects. Anything else reads as JSONL, whose rejects then say
    what is wrong per line. A file that cannot be decompressed also reads as JSONL: its reader reports where
    it broke."""
    try:
        with open_bytes(path) as f:
            head = f.read(SNIFF)
    except (OSError, *DECODE_ERRORS):
        return "lines"
    cr_only = b"\r" in head and b"\n" not in head
    body = head.lstrip(b" \t\r\n")
    if body.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
        body = body[3:].lstrip(b" \t\r\n")
    if body.startswith(b"["):
        return "array"
    lines = "cr-lines" if cr_only else "lines"
    if not body.startswith(b"{"):
        return lines
    first = body.split(b"\r" if cr_only else b"\n", 1)[0]
    try:
        orjson.loads(first)
        return lines
    except orjson.JSONDecodeError:
        pass
    try:  # the first object, however long (up to SNIFF_MAX: a broken first line must not scan the whole file)
        with open_bytes(path) as f:
            value = next(split_values(_Limited(f, SNIFF_MAX), array=False, eol=b"\r" if cr_only else b"\n"), None)
    except (OSError, *DECODE_ERRORS):
        return lines
    if value is None or value[2] is None:
        return lines
    try:
        return "objects" if isinstance(orjson.loads(value[2]), dict) else lines
    except orjson.JSONDecodeError:
        return lines


_STRUCTURE = re.compile(rb'["\\,\[\]{}]')
CHUNK = 1 << 20


def split_values(f: Any, array: bool, eol: bytes = b"\n", pos: Position | None = None, raw: Any = None
                 ) -> Iterator[tuple[int, int, bytes | None]]:
    """Yield (1-based line where it starts, 1-based number, bytes) of each record of a JSON array (`array`)
    or of concatenated top-level values, reading `f` in 1 MiB chunks and holding at most the current record.

    A scanner, not a parser: it follows strings (with escapes) and bracket depth only, so a broken record
    comes out as its bytes and fails in `parse_line` as an ordinary reject. Bytes is None once, at the end,
    when an array ends after a comma and is never closed (a truncated file)."""
    buf = bytearray()
    scan = 0  # next byte of buf to scan
    start = 0  # where the current record's bytes begin in buf
    counted, line = 0, 1  # buf[:counted] holds line - 1 line ends (plus those trimmed away)
    depth, in_str, skip = 0, False, -1
    top = 1 if array else 0  # records are the values at this depth
    opened = closed = False  # the array's `[` and `]`
    number = 0

    def record(end: int) -> tuple[int, int, bytes] | None:
        nonlocal counted, line, number
        seg = bytes(buf[start:end])
        body = seg.strip()
        if not body:
            return None
        first = start + len(seg) - len(seg.lstrip())
        line += buf.count(eol, counted, first)
        counted = first
        number += 1
        return line, number, body

    while True:
        chunk = f.read(CHUNK)
        if pos is not None and raw is not None:
            pos.bytes = raw.tell()
        if not chunk:
            break
        buf += chunk
        for m in _STRUCTURE.finditer(buf, scan):
            i = m.start()
            if i == skip:
                continue
            c = buf[i]
            if in_str:
                if c == 0x5C:  # backslash: the next byte is escaped
                    skip = i + 1
                elif c == 0x22:
                    in_str = False
                continue
            if c == 0x22:
                in_str = True
            elif c in b"[{":
                if array and depth == 0:  # the array opens (a second array after the first: its records follow)
                    opened, closed = True, False
                    depth = 1
                    start = i + 1
                    continue
                depth += 1
            elif c in b"]}":
                depth -= 1
                if array and depth == 0:
                    out = record(i)
                    if out is not None:
                        yield out
                    closed = True
                    start = i + 1
                elif not array and depth == 0:
                    out = record(i + 1)
                    if out is not None:
                        yield out
                    start = i + 1
                elif depth < 0:  # a stray closing bracket: it becomes part of a record that fails to parse
                    depth = 0
            elif depth == top:  # a comma between records
                out = record(i)
                if out is not None:
                    yield out
                start = i + 1
        scan = len(buf)
        line += buf.count(eol, counted, start)
        del buf[:start]
        scan, skip, counted, start = scan - start, skip - start, 0, 0
    tail = record(len(buf))
    if tail is not None:  # a record cut by the end of the file fails to parse: its reject says so
        yield tail
    elif array and opened and not closed:
        yield line + buf.count(eol, counted), number + 1, None


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
    """Yield (1-based line number, parsed object or RawError); blank lines are skipped, not records. A JSON
    array or concatenated objects yield each record at the line where it starts (a `RecordLoc`, which also
    carries its number). A file that cannot be decompressed to its end yields one `corrupt_file` RawError
    where it broke, then stops."""
    shape = layout(path)
    lineno = 0
    with open_bytes(path) as f:
        raw = getattr(f, "fileobj", None) or getattr(getattr(f, "raw", None), "fileobj", None) or f
        try:
            if shape in ("array", "objects"):
                for lineno, number, value in split_values(f, shape == "array", pos=pos, raw=raw):
                    loc = RecordLoc(lineno, number)
                    if value is None:
                        yield loc, RawError("corrupt_file", "the JSON array is not closed: the file ends inside "
                                                            "it (truncated?); the records before were read")
                        continue
                    yield from _records(loc, parse_line(value), shape)  # type: ignore[arg-type]  # never blank
                return
            for lineno, line in enumerate(_cr_lines(f) if shape == "cr-lines" else f, start=1):
                if pos is not None and lineno % 1024 == 0:
                    pos.bytes = raw.tell()
                obj = parse_line(line)
                if obj is None:
                    continue
                yield from _records(lineno, obj, "lines")
        except DECODE_ERRORS as exc:
            kind = "zstd" if isinstance(raw, _Zstd) or getattr(f, "raw", None).__class__ is _Zstd else "gzip"
            where = f"{kind} data broken after line {lineno} (compressed byte offset {_tell(raw)})"
            yield lineno + 1, corrupt(where, exc)


def _records(line: int, obj: dict[str, Any] | RawError, shape: str
             ) -> Iterator[tuple[int, dict[str, Any] | RawError]]:
    """One parsed value as records: an OTLP export holds many spans, each a record of that line."""
    if isinstance(obj, RawError):
        if shape != "lines" and obj.reason == "not_an_object":
            obj = RawError("not_an_object", obj.detail.replace("line holds", f"record {line.index} is")
                           if isinstance(line, RecordLoc) else obj.detail)
        yield line, obj
        return
    spans = expand_otlp(obj) if "resourceSpans" in obj else None
    if spans is None:
        yield line, obj
        return
    if not spans:
        yield line, RawError("empty_otlp_batch", "an OTLP export line with no spans")
    for span in spans:  # an OTLP JSON export: every span of the line is a record of that line
        yield line, span


def _cr_lines(f: Any) -> Iterator[bytes]:
    """Lines of a file whose line ends are CR alone (a CR followed by LF is one end, as in CRLF)."""
    rest = b""
    while True:
        chunk = f.read(CHUNK)
        if not chunk:
            break
        parts = (rest + chunk).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


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
    return (read_parquet if src.kind == "parquet" else read_jsonl)(src.path, pos)
