"""The Detector: fed by ingest one accepted chat record at a time, it keeps bounded state and decides,
per request, the rewrite operations that would remove its breakers; `finalize` turns that into findings.

Why online: the findings need message text, and ingest already holds each record once; a second pass
over the logs would double the I/O. Per request the detector aligns the early messages (system, tools,
first user message) with the exemplar of the request's family, records varying spans, drift and order
changes (the order checks are in `orders.py`), and rewrites + re-hashes the affected requests (only those)
for the counterfactual.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from prefixscan.affixes import common_prefix_length
from prefixscan.detect import normalisation as nz
from prefixscan.detect.accumulate import Acc, _example, _prefix_record
from prefixscan.detect.content import ContentMemo, tenant_salt
from prefixscan.detect.dynamic_fields import SlotLine, inline_date, read_line, tool_field
from prefixscan.detect.list_order import in_regions
from prefixscan.detect.orders import ListEntry, OrderChecks
from prefixscan.detect.pattern_free import PROSE, Alignment, Family, FamilyIndex, align, covered, is_edit
from prefixscan.detect.patterns import classify, split_label
from prefixscan.detect.pieces import Units, joined
from prefixscan.detect.rewrite import apply_ops
from prefixscan.encode.encoder import rewrite_hashes
from prefixscan.encode.hashing import ChainCache
from prefixscan.read.record import Record
from prefixscan.redact import redact_snippet

# Bound of the per-text memo (units of system prompts, first user messages, tool lists). A dynamic system
# prompt is new text on every request, so a bound by entry count let it reach hundreds of MiB; only speed
# depends on this bound (tests run with a tiny one).
MEMO_BYTES = 32 << 20
# Whole-message normalisers, in sorted order: applied to every request that needs them (cheap to check,
# always safe), so requests sent before the drift was first seen are normalised too.
PROACTIVE = ("line_endings", "unicode")


class Detector(OrderChecks):
    """Bounded-state cache-breaker detector (see module docstring)."""

    def __init__(self, block_size: int, memo_bytes: int | None = None) -> None:
        self.block_size = block_size
        self.index = FamilyIndex()
        self.accs: dict[tuple, Acc] = {}
        # Per rewritten request only the index of its operation set: requests share sets (a family's
        # field at the same place, a conversation's turns), and finding keys are stored once, by number.
        self.ops_of: dict[str, int] = {}  # request id -> index into `opsets`
        self.opsets: list[tuple[tuple[tuple, ...], tuple[int, ...]]] = []  # (operations, key number of each)
        self.keys: list[tuple] = []  # finding key by number (`alias_keys` renames them)
        self._opset_ids: dict[tuple, int] = {}
        self._key_ids: dict[tuple, int] = {}
        self.pending: list[tuple[str, Record, int]] = []
        self.rewritten: dict[str, tuple[list[np.ndarray], int]] = {}  # block hashes (in parts), prompt tokens
        self.orders: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.lists: dict[int, ListEntry] = {}  # serialized lists in early messages, by multiset hash
        self.held_chars = 0  # text of the records `ListEntry.held` keeps (bounded by HOLD_CHARS)
        self.moved: dict[int, list[tuple[int, int]]] = {}  # the current request's reordered list regions
        self.contents = ContentMemo(MEMO_BYTES if memo_bytes is None else memo_bytes)  # see content.py
        self.chains = ChainCache()
        self.tokenizer: Any = None
        self.seconds = 0.0
        self.errors = 0  # records the detector could not read (reported in the counterfactual summary)
        self.fed = 0
        self._seeded: set[tuple] = set()  # (finding key, family, exemplar unit) whose exemplar value was counted

    # ------------------------------------------------------------------ feeding
    def feed(self, rec: Record, root: int) -> None:
        """Look at one accepted chat record (called by ingest in input order)."""
        if rec.kind != "chat" or not rec.messages:
            return
        t0 = time.perf_counter()
        self.fed += 1
        try:
            self._feed(rec, root)
        except Exception:  # a detector bug must never stop an analysis; counted instead
            self.errors += 1
        finally:
            self.seconds += time.perf_counter() - t0

    def _units(self, rec: Record) -> tuple[list[int], dict[int, str], Units]:
        texts, content = self.contents.of(rec, tenant_salt(rec.tenant or ""))
        pieces = self.contents.pieces_of(content, rec, texts, live=False)
        return list(texts), texts, joined(pieces) if pieces else Units([], [], [], [])

    def _feed(self, rec: Record, root: int) -> None:
        tenant = rec.tenant or ""
        salt = tenant_salt(tenant)
        texts, c = self.contents.of(rec, salt)
        if not c.live:
            return
        ops: list[tuple[tuple, tuple]] = []
        list_ops: list[tuple[tuple, tuple]] = []  # first: a reordered list's lines are not spans (`_spans`)
        self.moved = self._lists(rec, root, c.lists, list_ops) if c.lists else {}
        live = None  # the pieces, fetched only when something is computed from units
        if c.version != self.index.version:
            live = self.contents.pieces_of(c, rec, texts)
            c.fam, c.wants_new = self.index.assign(salt, live)
            c.version = self.index.version
        fam = c.fam
        units = None
        if fam is None or c.wants_new:
            units = joined(live or self.contents.pieces_of(c, rec, texts))
            self._new_family(rec, tenant, salt, root, units, texts)
        if fam is not None:
            fam.requests += 1
            if c.fid != fam.fid:
                units = joined(live or self.contents.pieces_of(c, rec, texts)) if units is None else units
                new = align(units, fam)
                c.al, c.fid = new, fam.fid
                if len(new.pairs) + len(new.runs) + len(new.drifts) > 4:  # charged a few tuples already
                    self.contents.aligned(c)
            al = c.al
            assert al is not None  # set with c.fid
            if al.pairs or al.drifts or fam.slots:  # else nothing differs from the exemplar: no span, no drift
                units = joined(live or self.contents.pieces_of(c, rec, texts)) if units is None else units
                if al.pairs or fam.slots:
                    self._spans(rec, fam, al, units, texts, ops)
                if al.drifts:
                    self._drifts(rec, fam, al, units, texts, ops)
        if c.checks:
            self._orders(rec, c.checks, ops)
        ops += list_ops
        if c.cr:  # the whole-message normalisers (`PROACTIVE`), in sorted order
            ops.append((("normalise", "line_endings"), ("drift", tenant, "line_endings")))
        if c.nonnfc:
            ops.append((("normalise", "unicode"), ("drift", tenant, "unicode")))
        if ops:
            self._queue(rec, root, ops)

    def _new_family(self, rec: Record, tenant: str, salt: int, root: int, units: Units,
                    texts: dict[int, str]) -> None:
        ftexts: list[str | None] = []
        pre: list[str] = []
        prev = None
        for u in units:
            ftexts.append(texts[u.mi][u.start:u.end].rstrip("\n") if u.mi >= 0 and u.length <= 4096 else None)
            pre.append(texts[u.mi][prev.end if prev is not None and prev.mi == u.mi else 0:u.start]
                       if u.mi >= 0 else "")
            prev = u
        chars = sum(len(t) for t in texts.values())
        self.index.new_family(tenant, salt, units, ftexts, rec.request_id, root, rec, chars, pre)

    def _anchor(self, units: Units, j: int) -> int:
        """The first long unit's hash from unit j on (else unit j's, or 0 past the end)."""
        return next((units[t].norm for t in range(j, len(units)) if units[t].length >= nz.BIG),
                    units[j].norm if j < len(units) else 0)

    def _acc(self, key: tuple, tenant: str, mi: int, role: str, label: str, example: str | Callable[[], str],
             rid: str, offset: int | None, rec: Record) -> Acc:
        """The accumulator of `key`, made on its first request (`example` may be a function: only then
        is it needed)."""
        acc = self.accs.get(key)
        if acc is None:
            fam = f"{key[-1]:016x}"[:8] if isinstance(key[-1], int) else None
            acc = Acc(key, tenant, mi, role, label, fam or "", example() if callable(example) else example, rid,
                      offset)
            self.accs[key] = acc
            if offset is not None:
                acc.prefix = _prefix_record(rec, mi, offset)
        return acc

    def _spans(self, rec: Record, fam: Family, al: Alignment, units: Units, texts: dict[int, str],
               ops: list) -> None:
        msgs = rec.messages or []
        rid = rec.request_id
        seen_e: set[int] = set()
        bad = {j for ri, ei, j, _ in al.pairs if not self._pair_ok(units[ri], fam, ei, texts)
               or in_regions(self.moved, units[ri])}  # lines of a list seen in another order: `list_order`
        for ri, ei, j, i0 in al.pairs:
            if j in bad:
                continue  # a different passage in the span: the variable layer, not a breaker
            if units[ri].mi < 0:
                if ei is not None:
                    self._tool_span(rec, fam, units[ri], fam.units[ei], ops)
                continue
            other = fam.texts[ei] if ei is not None else None
            sl = read_line(texts, units, ri, other)
            if sl is None:
                continue
            role = msgs[sl.mi].get("role", "")
            # Identity: the nearest long unchanged line before the span in its message (else the shared
            # content after it), so one field keeps one key whichever document or template version follows.
            anchor = next((units[t].norm for t in range(i0 - 1, -1, -1)
                           if units[t].mi == units[ri].mi and units[t].length >= nz.BIG), None)
            if anchor is None:
                anchor = self._anchor(units, j)
            # Unlabelled dates in sentences are told apart by kind (two such sentences may share an anchor).
            lab = "\x00" + (sl.kind or "") if sl.inline else sl.label.lower()
            key = ("span", fam.tenant, sl.mi, lab, anchor)
            # ignore below: mypy cannot infer a lambda whose default (sl=sl) binds this loop's line
            acc = self._acc(key, fam.tenant, sl.mi, role, sl.label, lambda sl=sl: _example(sl, sl.kind),  # type: ignore[misc]
                            rid,
                            sl.value_offset, rec)
            acc.observe(sl.kind, sl.value)
            acc.add_request(rid)
            acc.fids.add(fam.fid)
            if sl.inline:  # a date inside a sentence: measured with the exemplar's line, never moved by `fix`
                acc.detail = "inline"
                if other is not None and (key, fam.fid, ei) not in self._seeded:
                    self._seeded.add((key, fam.fid, ei))  # the exemplar's date counts too (once)
                    got = inline_date(other, texts[sl.mi][units[ri].start:units[ri].end].rstrip("\n"))
                    if got is not None:
                        acc.observe(got[0], other[got[1]:got[2]])
                if other is not None:
                    ops.append((("replace", sl.mi, units[ri].start, _line_end(texts, units[ri]), other), key))
                continue
            if sl.prose:
                acc.prose += 1
                if ei is not None and other is not None and ("prose", ei) not in fam.slots:
                    # Marker: from now on requests on the exemplar's version are counted as they come;
                    # every family request so far (but this one) was on it.
                    fam.slots[("prose", ei)] = key
                    acc.count_value(other, fam.requests - 1)
                    acc.prose += 1
                if other is not None:
                    ops.append((("replace", sl.mi, units[ri].start, _line_end(texts, units[ri]), other), key))
                continue
            ops.append((("move", sl.mi, sl.block[0], sl.block[1]), key))
            if ei is not None:
                if ei not in fam.slots and other is not None:
                    acc.observe(sl.kind, split_label(other).value)  # the exemplar's value counts too
                fam.slots.setdefault(ei, key)
                seen_e.add(ei)
        for mark, key in fam.slots.items():
            if isinstance(mark, tuple) and mark[1] not in seen_e and covered(al, mark[1]) is not None:
                self.accs[key].count_value(fam.texts[mark[1]] or "", 1)  # a request on the exemplar's version
        self._move_slots(fam, units, texts, rid, ops, lambda ei: None if ei in seen_e else covered(al, ei))

    def _move_slots(self, fam: Family, units: Units, texts: dict[int, str], rid: str, ops: list,
                    where: Callable[[int], int | None] | None = None) -> None:
        """Move the request's lines at its family's field slots (`where(exemplar unit)`: the request's unit
        there, or None; without `where` the request is the exemplar)."""
        for ei, key in sorted((k, v) for k, v in fam.slots.items() if isinstance(k, int)):
            rj = ei if where is None else where(ei)
            sl = read_line(texts, units, rj, None) if rj is not None and rj < len(units) else None
            if sl is None or sl.prose:
                continue
            self.accs[key].add_request(rid)
            ops.append((("move", sl.mi, sl.block[0], sl.block[1]), key))

    def _tool_span(self, rec: Record, fam: Family, u: nz.Unit, e: nz.Unit, ops: list) -> None:
        """A field inside a tool definition (a date in a description): found like a line field, located in
        the tool's JSON; the counterfactual takes the exemplar's tool, `fix` cannot move it."""
        if fam.tools is None or not rec.tools or e.start >= len(fam.tools) or u.start >= len(rec.tools):
            return
        tf = tool_field(rec.tools[u.start], fam.tools[e.start])
        if tf is None:
            return
        label, value, offset, name = tf
        kind = classify(label, value)
        key = ("span", fam.tenant, -1, label.lower(), xxhash.xxh3_64_intdigest(name.encode()))
        sl = SlotLine(-1, label, value, offset, (0, 0), kind, False)
        acc = self._acc(key, fam.tenant, -1, "tools", label, lambda: _example(sl, kind), rec.request_id, offset,
                        rec)
        acc.observe(kind, value)
        acc.add_request(rec.request_id)
        acc.fids.add(fam.fid)
        ops.append((("retool_cf", u.start, fam.tools[e.start]), key))

    @staticmethod
    def _pair_ok(u: nz.Unit, fam: Family, ei: int | None, texts: dict[int, str]) -> bool:
        """Short lines are field-like; a long line (or tool) only counts when it is an edit of the exemplar's."""
        if ei is None:
            return True
        e = fam.units[ei]
        if u.length < PROSE and e.length < PROSE:
            return True
        if u.mi < 0:
            return fam.tools is not None and e.start < len(fam.tools)
        other = fam.texts[ei]
        return other is not None and is_edit(texts[u.mi][u.start:u.end].rstrip("\n"), other)

    def _drifts(self, rec: Record, fam: Family, al: Alignment, units: Units, texts: dict[int, str],
                ops: list) -> None:
        """Units equal to the exemplar's up to normalisation. CRLF and NFC are normalised wholesale (below);
        whitespace and key order are restored to the exemplar's bytes, unit by unit, so canonical requests
        are never touched and a conversation stays consistent whenever the drift was first seen."""
        done: set[str] = set()
        for ri, ei in al.drifts:
            kind = nz.drift_kind(units[ri], fam.units[ei])
            u = units[ri]
            key = ("drift", fam.tenant, kind)
            if kind not in done:
                done.add(kind)
                self._drift_acc(rec, fam, u, ei, kind, texts)
            if kind in PROACTIVE:
                continue
            if u.mi < 0:
                if fam.tools is not None and 0 <= e_tool(fam, ei) < len(fam.tools):
                    ops.append((("retool", u.start, fam.tools[e_tool(fam, ei)]), key))
                continue
            other = fam.texts[ei]
            if other is None:
                continue
            prev_end = units[ri - 1].end if ri > 0 and units[ri - 1].mi == u.mi else 0
            ops.append((("restore", u.mi, prev_end, _line_end(texts, u), fam.pre[ei] + other), key))

    def _drift_acc(self, rec: Record, fam: Family, u: nz.Unit, ei: int, kind: str, texts: dict[int, str]) -> None:
        key = ("drift", fam.tenant, kind)
        acc = self.accs.get(key)
        if acc is not None:  # the example and its offset are the first request's
            acc.observe(kind, str(u.raw))
            return
        role = "tools" if u.mi < 0 else (rec.messages or [])[u.mi].get("role", "")
        offset = None
        if u.mi >= 0:
            line = texts[u.mi][u.start:u.end].rstrip("\n")
            other = fam.texts[ei]
            offset = u.start + (common_prefix_length(line, other) if other is not None else 0)
            example = redact_snippet(f"{kind}: " + line.replace("\r", "\\r"), 96)
        else:
            example = f"{kind}: tool {u.start} serialised differently"
        acc = self._acc(key, fam.tenant, u.mi, role, "", example, rec.request_id, offset, rec)
        acc.observe(kind, str(u.raw))

    def _needs(self, kind: str, rec: Record, eidx: list[int], texts: dict[int, str]) -> bool:
        if kind == "json_key_order" and rec.tools:
            from prefixscan.detect.normalisation import _sorted_json

            if any(list(t) != list(_sorted_json(t)) for t in rec.tools if isinstance(t, dict)):
                return True
        return any(nz.needs(kind, texts[mi]) for mi in eidx)

    def _queue(self, rec: Record, root: int, ops: list[tuple[tuple, tuple]]) -> None:
        rid = rec.request_id
        sid = self._opset(tuple(o for o, _ in ops), tuple(self._key_id(k) for _, k in ops))
        self.ops_of[rid] = sid
        msgs, tools = apply_ops(rec.messages or [], rec.tools, list(self.opsets[sid][0]), counterfactual=True)
        new = Record(source_file=rec.source_file, source_line=rec.source_line, request_id=rid,
                     timestamp_s=rec.timestamp_s, kind="chat", tenant=rec.tenant, messages=msgs, tools=tools)
        self.pending.append((rid, new, root))

    def _key_id(self, key: tuple) -> int:
        i = self._key_ids.get(key)
        if i is None:
            i = self._key_ids[key] = len(self.keys)
            self.keys.append(key)
        return i

    def _opset(self, ops: tuple[tuple, ...], kids: tuple[int, ...]) -> int:
        """Index of an equal operation set seen before, else of this one (added)."""
        sig = (tuple(_sig(o) for o in ops), kids)
        i = self._opset_ids.get(sig)
        if i is None:
            i = self._opset_ids[sig] = len(self.opsets)
            self.opsets.append((ops, kids))
        return i

    # ------------------------------------------------------------------ reading back
    def alias_keys(self, alias: dict[tuple, tuple]) -> None:
        """Rename finding keys (merged accumulators) in every operation set."""
        self.keys = [alias.get(k, k) for k in self.keys]

    def opset_keys(self) -> list[list[tuple]]:
        """Per operation set, its distinct finding keys in first-use order."""
        return [list(dict.fromkeys(self.keys[i] for i in kids)) for _, kids in self.opsets]

    def kept_ops(self, sid: int, kept: set | dict) -> list[tuple]:
        """The operations of set `sid` whose finding is in `kept`, in order."""
        ops, kids = self.opsets[sid]
        return [o for o, i in zip(ops, kids, strict=True) if self.keys[i] in kept]

    # ------------------------------------------------------------------ batch work
    def flush(self, tokenizer: Any) -> None:
        """Tokenise and hash the rewritten requests queued so far (ingest calls this once per batch)."""
        if tokenizer is None:
            return
        t0 = time.perf_counter()
        self.tokenizer = tokenizer
        if self.pending:
            for rid, parts, n in rewrite_hashes(tokenizer, self.chains, self.block_size, self.pending):
                self.rewritten[rid] = (parts, n)
            self.pending.clear()
        self.seconds += time.perf_counter() - t0

    def take_pending(self) -> list[tuple[str, Record, int]]:
        """The rewritten requests queued since the last call, for an encode worker to tokenise and hash
        (ingest with workers); their hashes come back through `put_rewritten`."""
        out, self.pending = self.pending, []
        return out

    def put_rewritten(self, rid: str, parts: list[np.ndarray], n_tokens: int) -> None:
        self.rewritten[rid] = (parts, n_tokens)

    def retro_exemplars(self) -> None:
        """Rewrite family exemplars whose spans were only recognised once later requests arrived."""
        for fam in self.index.families:
            rec = fam.record
            if rec is None or rec.request_id in self.ops_of:
                continue
            eidx, texts, units = self._units(rec)
            ops: list[tuple[tuple, tuple]] = []
            self._move_slots(fam, units, texts, rec.request_id, ops)
            for kind in PROACTIVE:
                if self._needs(kind, rec, eidx, texts):
                    ops.append((("normalise", kind), ("drift", fam.tenant, kind)))
            if ops:
                self._queue(rec, fam.root, ops)


def _sig(op: tuple) -> tuple:
    """A hashable stand-in for an operation: unhashable parts (a tool's dict) by identity. Equal stand-ins
    mean equal operations; the set holding the operation keeps those parts alive, so no identity is reused."""
    return tuple(_part(x) for x in op)


def _part(x: Any) -> Any:
    try:
        hash(x)
    except TypeError:
        return ("id", id(x))
    return x


def _line_end(texts: dict[int, str], u: nz.Unit) -> int:
    """Where unit `u`'s line ends in its message, its newline left out."""
    return u.end - 1 if texts[u.mi][u.end - 1:u.end] == "\n" else u.end


def e_tool(fam: Family, ei: int) -> int:
    """Tool index of exemplar unit `ei` (tool units store their index as `start`)."""
    return fam.units[ei].start if fam.units[ei].mi < 0 else -1
