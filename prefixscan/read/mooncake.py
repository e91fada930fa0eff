"""Compiled reader for the canonical Mooncake JSONL line, straight into arrays.

A Mooncake trace is millions of lines like `{"timestamp":13,"input_length":3615,"output_length":44,
"hash_ids":[0,1,2]}`. Parsing each into a dict and a Record costs more than the whole analysis, so this
kernel scans the bytes of a chunk of whole lines and fills numpy arrays. It accepts only the strict
canonical subset (those four keys at most once each, ASCII, integer literals, `null` output length) and
flags every other line as *slow*: the caller parses a slow line with the ordinary per-line path
(`readers.parse_line` + `shapes.normalise`), which decides acceptance or the reject reason. So the fast
path never accepts what the ordinary path would reject, and never changes a value it would read
(tests/test_mooncake_fast.py checks both on canonical and adversarial lines).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from numba import njit

from prefixscan.read.readers import DECODE_ERRORS, Position, RawError, corrupt, open_bytes

CHUNK_BYTES = 16 << 20
ACCEPTED, BLANK, SLOW = 0, 1, 2
# key codes; the order is irrelevant, each may appear at most once
_KEYS = (b"timestamp", b"input_length", b"output_length", b"hash_ids")
MAX_DIGITS = 15  # |value| < 10^15 < 2^53: exact as int64 and as float64, far beyond any real trace


@njit(cache=True)
def _skip_ws(buf, p, end):
    while p < end and (buf[p] == 32 or buf[p] == 9 or buf[p] == 13):  # JSON whitespace within a line
        p += 1
    return p


@njit(cache=True)
def _int(buf, p, end, signed):
    """(value, new position, ok) of a JSON integer literal with at most MAX_DIGITS digits."""
    neg = False
    if signed and p < end and buf[p] == 45:  # '-'
        neg = True
        p += 1
    start = p
    v = 0
    while p < end and 48 <= buf[p] <= 57:
        v = v * 10 + (buf[p] - 48)
        p += 1
    nd = p - start
    if nd == 0 or nd > MAX_DIGITS or (nd > 1 and buf[start] == 48):
        return 0, p, False
    if p < end and (buf[p] == 46 or buf[p] == 101 or buf[p] == 69):  # '.', 'e', 'E': not an integer
        return 0, p, False
    return (-v if neg else v), p, True


@njit(cache=True)
def _key(buf, p, end, k0, k1, k2, k3):
    """Key code 0-3 of the quoted key at p (just after the opening quote) and the position after the
    closing quote, or -1 for any other key (including escapes)."""
    q = p
    while q < end and buf[q] != 34:
        if buf[q] == 92 or buf[q] >= 128:
            return -1, q
        q += 1
    if q >= end:
        return -1, q
    n = q - p
    keys = (k0, k1, k2, k3)
    for code in range(4):
        k = keys[code]
        if len(k) == n:
            same = True
            for i in range(n):
                if buf[p + i] != k[i]:
                    same = False
                    break
            if same:
                return code, q + 1
    return -1, q


@njit(cache=True)
def _line(buf, p, end, k0, k1, k2, k3, ids, n_ids):
    """Parse one line [p, end). Returns (status, ts, input_length, output_length or -1, ids written)."""
    q = p
    blank = True
    while q < end:
        c = buf[q]
        if not (c == 32 or c == 9 or c == 13 or c == 11 or c == 12):
            blank = False
            break
        q += 1
    if blank:
        return BLANK, 0, 0, 0, 0
    p = _skip_ws(buf, p, end)
    if p >= end or buf[p] != 123:  # '{'
        return SLOW, 0, 0, 0, 0
    p = _skip_ws(buf, p + 1, end)
    seen = np.zeros(4, np.bool_)
    ts = 0
    inl = 0
    outl = -1
    m = 0
    while True:
        if p >= end or buf[p] != 34:
            return SLOW, 0, 0, 0, 0
        code, p = _key(buf, p + 1, end, k0, k1, k2, k3)
        if code < 0 or seen[code]:
            return SLOW, 0, 0, 0, 0
        seen[code] = True
        p = _skip_ws(buf, p, end)
        if p >= end or buf[p] != 58:  # ':'
            return SLOW, 0, 0, 0, 0
        p = _skip_ws(buf, p + 1, end)
        if code == 0:
            ts, p, ok = _int(buf, p, end, True)
            if not ok:
                return SLOW, 0, 0, 0, 0
        elif code == 1:
            inl, p, ok = _int(buf, p, end, False)
            if not ok:
                return SLOW, 0, 0, 0, 0
        elif code == 2:
            if p + 4 <= end and buf[p] == 110 and buf[p + 1] == 117 and buf[p + 2] == 108 and buf[p + 3] == 108:
                outl = -1
                p += 4
            else:
                outl, p, ok = _int(buf, p, end, False)
                if not ok:
                    return SLOW, 0, 0, 0, 0
        else:
            if p >= end or buf[p] != 91:  # '['
                return SLOW, 0, 0, 0, 0
            p = _skip_ws(buf, p + 1, end)
            m = 0
            if p < end and buf[p] == 93:  # ']'
                p += 1
            else:
                while True:
                    v, p, ok = _int(buf, p, end, True)
                    if not ok or n_ids + m >= len(ids):
                        return SLOW, 0, 0, 0, 0
                    ids[n_ids + m] = v
                    m += 1
                    p = _skip_ws(buf, p, end)
                    if p < end and buf[p] == 44:  # ','
                        p = _skip_ws(buf, p + 1, end)
                        continue
                    if p < end and buf[p] == 93:
                        p += 1
                        break
                    return SLOW, 0, 0, 0, 0
        p = _skip_ws(buf, p, end)
        if p < end and buf[p] == 44:
            p = _skip_ws(buf, p + 1, end)
            continue
        if p < end and buf[p] == 125:  # '}'
            p = _skip_ws(buf, p + 1, end)
            break
        return SLOW, 0, 0, 0, 0
    # the ordinary path needs timestamp, input_length and hash_ids; anything missing is its business
    if p != end or not seen[0] or not seen[1] or not seen[3]:
        return SLOW, 0, 0, 0, 0
    return ACCEPTED, ts, inl, outl, m


@njit(cache=True, nogil=True)
def scan_chunk(buf, k0, k1, k2, k3, n_lines):  # pragma: no cover - compiled
    """Parse every line of `buf` (whole lines; the last may lack its newline).

    Returns per line (status, ts, input_length, output_length, id count, start, end) and the flat ids of
    accepted lines in order.
    """
    status = np.zeros(n_lines, np.int8)
    ts = np.zeros(n_lines, np.int64)
    inl = np.zeros(n_lines, np.int64)
    outl = np.zeros(n_lines, np.int64)
    cnt = np.zeros(n_lines, np.int64)
    starts = np.zeros(n_lines, np.int64)
    ends = np.zeros(n_lines, np.int64)
    ids = np.empty(len(buf) // 2 + 1, np.int64)
    n_ids = 0
    li = 0
    p = 0
    n = len(buf)
    while p < n and li < n_lines:
        e = p
        while e < n and buf[e] != 10:
            e += 1
        st, a, b, c, m = _line(buf, p, e, k0, k1, k2, k3, ids, n_ids)
        status[li] = st
        starts[li] = p
        ends[li] = e
        if st == ACCEPTED:
            ts[li] = a
            inl[li] = b
            outl[li] = c
            cnt[li] = m
            n_ids += m
        li += 1
        p = e + 1
    return status[:li], ts[:li], inl[:li], outl[:li], cnt[:li], starts[:li], ends[:li], ids[:n_ids].copy()


@dataclass
class Chunk:
    """One chunk's lines: accepted ones as arrays, the rest as (line number, raw bytes) for the slow path."""

    line: np.ndarray  # 1-based line numbers of accepted lines
    timestamp_ms: np.ndarray
    input_length: np.ndarray
    output_length: np.ndarray  # -1 = null
    lengths: np.ndarray
    ids: np.ndarray
    slow: list[tuple[int, bytes | RawError]]  # a RawError: the file is damaged from that line on
    non_blank: int


def parse_chunk(data: bytes, first_line: int, newline_after: bool = False) -> Chunk:
    """Scan whole lines `data` whose first line has number `first_line`; slow lines keep their newline
    (the ordinary path parses the line as read, and its error messages count that byte)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    n_lines = data.count(b"\n") + 1
    st, ts, inl, outl, cnt, starts, ends, ids = scan_chunk(buf, *_KEYS, n_lines)
    lines = np.arange(first_line, first_line + len(st), dtype=np.int64)
    ok = st == ACCEPTED
    n = len(data)
    slow: list[tuple[int, bytes | RawError]]
    slow = [(int(lines[i]), data[starts[i]:ends[i] + 1] + (b"\n" if newline_after and ends[i] == n else b""))
            for i in np.flatnonzero(st == SLOW)]
    return Chunk(lines[ok], ts[ok], inl[ok], outl[ok], cnt[ok], ids, slow, int((st != BLANK).sum()))


def _whole_lines(path: str, pos: Position | None,
                 chunk_bytes: int) -> Iterator[tuple[bytes | RawError, int, bool]]:
    """(bytes of whole lines, number of the first line, whether a newline followed) in file order; a
    file that cannot be decompressed to its end ends with (RawError, its line number, False) after every
    whole line decompressed before the damage (a gzip file is read in single decompression steps, so
    none of those is lost with the failing step)."""
    line = 1
    with open_bytes(path) as f:
        raw = getattr(f, "fileobj", None) or f
        read = f.read1 if raw is not f else f.read
        carry = b""
        while True:
            parts, got, broken = [carry], 0, None
            while got < chunk_bytes:  # new bytes this round
                try:
                    piece = read(chunk_bytes - got)
                except DECODE_ERRORS as exc:
                    broken = exc
                    break
                if not piece:
                    break
                parts.append(piece)
                got += len(piece)
            data = b"".join(parts)
            if got == 0 and broken is None:  # end of file
                break
            cut = data.rfind(b"\n")
            carry = data[cut + 1:]
            if cut >= 0:
                whole = data[:cut]  # without the final newline: lines = count("\n") + 1
                if pos is not None:
                    pos.bytes = raw.tell()
                yield whole, line, True
                line += whole.count(b"\n") + 1
            if broken is not None:
                at = f"gzip data broken after line {line - 1} (compressed byte offset {raw.tell():,})"
                yield corrupt(at, broken), line, False
                return
        if carry:
            yield carry, line, False


def iter_chunks(path: str, pos: Position | None = None, chunk_bytes: int | None = None,
                ids: Callable[[np.ndarray], np.ndarray] | None = None) -> Iterator[Chunk]:
    """Chunks of whole lines of a (possibly gzipped) JSONL file, parsed in file order.

    The kernel releases the GIL, so one chunk is parsed on a second thread while the next is read and the
    previous one is consumed (the machine's second core; results come back in order). `ids`, if given,
    maps each chunk's block ids on that thread too (the reader namespaces them there).
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    def parse(data: bytes, first_line: int, newline_after: bool) -> Chunk:
        c = parse_chunk(data, first_line, newline_after)
        if ids is not None:
            c.ids = ids(c.ids)
        return c

    size = chunk_bytes or CHUNK_BYTES
    with ThreadPoolExecutor(max_workers=2) as pool:
        pending: list[Future[Chunk]] = []
        for whole, line, nl in _whole_lines(path, pos, size):
            if isinstance(whole, RawError):
                yield from (fut.result() for fut in pending)
                pending = []
                e = np.zeros(0, np.int64)
                yield Chunk(e, e, e, e, e, e, [(line, whole)], 1)
                break
            pending.append(pool.submit(parse, whole, line, nl))
            if len(pending) >= 2:
                yield pending.pop(0).result()
        for fut in pending:
            yield fut.result()
