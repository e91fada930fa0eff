"""The detector's per-text functions as they were before their bulk rewrites: one Python step per line or
per item, obviously following the rules their docstrings state. The fast versions in `prefixscan/detect`
are property-tested equal to these (tests/test_detect_bulk.py)."""

from __future__ import annotations

from prefixscan.detect import normalisation as nz
from prefixscan.detect.list_order import _BLANK, _ENUM, _HEAD_END, _SEPARATOR, MIN_ITEMS, _core


def message_units(mi: int, text: str, seed: int) -> list[nz.Unit]:
    """Units of one message's leading text; blank lines fold into the next unit's raw hash."""
    units: list[nz.Unit] = []
    pos = 0
    n = min(len(text), nz.MAX_CHARS)
    pending_blank = ""
    while pos < n:
        nl = text.find("\n", pos)
        end = len(text) if nl < 0 else nl + 1
        line = text[pos:end - 1] if nl >= 0 else text[pos:end]
        if not line.strip():
            pending_blank += text[pos:end]
            pos = end
            continue
        block = json_block(text, pos, end, line, n)
        if block is not None:
            end, line = block
        norm, flags, nosort = nz.normal_line(line) if block is None else nz._normal_json(line)
        if pending_blank and (pending_blank.count("\n") != 1 or pending_blank.strip("\n")):
            flags |= nz.WS
        nh = nz.text_hash(norm, seed)
        rh = nh if norm == line and not pending_blank else nz.text_hash(pending_blank + line, seed)
        units.append(nz.Unit(mi, pos, end, nh, rh, flags, nosort, len(line)))
        pending_blank = ""
        pos = end
    return units


def paragraph_hash(text: str, seed: int = 0) -> int:
    return nz.text_hash(" ".join(nz.normal_line(ln)[0] for ln in text.split("\n") if ln.strip()), seed)


def paragraph_hashes(text: str) -> tuple[tuple[int, ...], list[int]] | None:
    """Hashes and starts of the paragraphs before the last one (the question), when there are enough."""
    paras = nz.paragraphs(text)
    if len(paras) >= 3 and paras[-1][1] >= 256:
        return tuple(paragraph_hash(text[s:e]) for s, e in paras), [s for s, _ in paras]
    return None


def separated(text: str) -> list[tuple[int, int]]:
    """Items of a list of chunks between separator lines."""
    padded = "\n" + text
    seps = [(m.start(), m.end() - 1) for m in _SEPARATOR.finditer(padded)]
    if len(seps) < 2:
        return []
    items: list[tuple[int, int] | None] = []
    start = 0
    for m in _HEAD_END.finditer(padded, 0, seps[0][0] + 1):
        start = m.end()
    items.append(_core(text, start, seps[0][0]))
    for (_, e), (s, _) in zip(seps, seps[1:], strict=False):
        items.append(_core(text, e, s))
    tail = _BLANK.search(text, seps[-1][1])
    items.append(_core(text, seps[-1][1], tail.start() if tail else len(text)))
    return [it for it in items if it is not None]


def numbered(text: str) -> list[list[tuple[int, int]]]:
    """Numbered or bulleted lists: each item up to the next marker, the last one up to the paragraph's end."""
    out: list[list[tuple[int, int]]] = []
    run: list[tuple[int, int]] = []
    starts = [(m.start(), m.end() - 1) for m in _ENUM.finditer("\n" + text)]
    for k, (_, item) in enumerate(starts):
        nxt = starts[k + 1][0] if k + 1 < len(starts) else None
        blank = _BLANK.search(text, item, nxt if nxt is not None else len(text))
        end = blank.start() if blank else (nxt if nxt is not None else len(text))
        core = _core(text, item, end)
        if core is not None:
            run.append(core)
        if blank is not None or nxt is None:
            if len(run) >= MIN_ITEMS:
                out.append(run)
            run = []
    return out


def order_signature(hs: tuple[int, ...], seed: int) -> tuple[int, int]:
    """(multiset hash, sequence hash) of items, as numpy packed them."""
    import numpy as np
    import xxhash

    ms = xxhash.xxh3_64_intdigest(np.asarray(sorted(hs), dtype=np.uint64).tobytes(), seed=seed)
    return ms, xxhash.xxh3_64_intdigest(np.asarray(hs, dtype=np.uint64).tobytes())


def piece_columns(units: list[nz.Unit]) -> tuple[list[int], list[int], list[int]]:
    return [u.norm for u in units], [u.raw for u in units], [u.length for u in units]


def json_block(text: str, pos: int, end: int, line: str, n: int) -> tuple[int, str] | None:
    """The closing line of a multi-line JSON value, looked for line by line."""
    import orjson

    t = line.strip()
    if not t or t[0] not in "{[" or (t[-1] in "}]" and len(t) > 1):
        return None
    indent = len(line) - len(line.lstrip())
    close = "}" if t[0] == "{" else "]"
    cur = end
    for _ in range(nz.MAX_JSON_LINES):
        if cur >= n or cur - pos > nz.MAX_JSON_CHARS:
            return None
        nl = text.find("\n", cur)
        nxt = len(text) if nl < 0 else nl + 1
        ln = text[cur:nxt].rstrip("\n").rstrip("\r")
        s = ln.strip()
        if s[:1] == close and len(ln) - len(ln.lstrip()) == indent and s.rstrip(",") == close:
            body = text[pos:cur] + ln
            try:
                orjson.loads(body.strip())
            except orjson.JSONDecodeError:
                return None
            return nxt, body
        cur = nxt
    return None
