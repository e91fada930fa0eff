"""The Detector's order checks: the same items as a request seen before, in another order.

Two kinds: tool and RAG orders (`_orders`: a tool list or the paragraphs of a message, by multiset hash)
and serialized lists in early messages (`_lists`, `list_order.py`), whose requests sent in the list's
first order are held until a second order shows the list is a breaker (`retro_lists`). `OrderChecks` is
a part of `detector.Detector` (it uses the detector's accumulators and operation queue), kept apart so
each file reads alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefixscan.detect import normalisation as nz
from prefixscan.detect.list_order import KIND as LIST_KIND
from prefixscan.detect.list_order import UNSAFE as LIST_UNSAFE
from prefixscan.detect.list_order import TextList, first_difference
from prefixscan.read.record import Record

if TYPE_CHECKING:
    from collections.abc import Callable

    from prefixscan.detect.accumulate import Acc

MAX_ORDERS = 500_000
# Records sent in a list's first order before a second order showed it is a breaker: kept (bounded by
# their text) so they can be rewritten to the sorted order too; beyond the bound they stay as sent.
HOLD_CHARS = 16_000_000
# Lists tracked (one entry, ~350 bytes, per multiset of items): a list holding a dynamic field is a new
# multiset on every request, so without a bound it would grow with the log; past it, new lists are not
# tracked (only recall depends on it).
MAX_LISTS = 100_000


class OrderChecks:
    """The order checks of `detector.Detector` (its state: `orders`, `lists`, `held_chars`)."""

    accs: dict[tuple, Acc]
    orders: dict[int, tuple[int, tuple[int, ...]]]
    lists: dict[int, ListEntry]
    held_chars: int
    ops_of: dict[str, int]
    opsets: list[tuple[tuple[tuple, ...], tuple[int, ...]]]
    keys: list[tuple]

    if TYPE_CHECKING:  # the detector's own, used here
        def _acc(self, key: tuple, tenant: str, mi: int, role: str, label: str, example: str | Callable[[], str],
                 rid: str, offset: int | None, rec: Record) -> Acc: ...

        def _queue(self, rec: Record, root: int, ops: list[tuple[tuple, tuple]]) -> None: ...

    def _orders(self, rec: Record, checks: list[tuple], ops: list) -> None:
        """Tool and RAG order: the same items as a request seen before, in another order."""
        tenant = rec.tenant or ""
        msgs = rec.messages or []
        for kind, mi, hs, starts, ms, seq in checks:
            entry = self.orders.get(ms)
            if entry is None:
                if len(self.orders) < MAX_ORDERS:
                    self.orders[ms] = (seq, hs)
                continue
            if entry[0] == seq:
                continue
            first = next(i for i, (a, b) in enumerate(zip(hs, entry[1], strict=True)) if a != b)
            role = "tools" if mi < 0 else msgs[mi].get("role", "")
            key = ("order", tenant, kind, mi)
            where = f"tool {first}" if mi < 0 else f"paragraph {first}"
            acc = self._acc(key, tenant, mi, role, "", f"{kind}: same {len(hs)} items, {where} differs", rec.request_id,
                            starts[first], rec)
            acc.observe(kind, str(seq))
            acc.add_request(rec.request_id)
            ops.append((("reorder", mi, entry[1]), key))

    def _lists(self, rec: Record, root: int, lists: list[tuple], ops: list) -> dict[int, list[tuple[int, int]]]:
        """Serialized lists in early messages (list_order.py): the same items as a request seen before,
        in another order. The canonical order is the sort by a name/id key where that is safe, else the
        first order seen; requests not in it are rewritten once the list was seen in two orders.
        Returns the regions (by message) of this request's lists that were seen in another order."""
        moved: dict[int, list[tuple[int, int]]] = {}
        for mi, tl, ms, _seq in lists:
            entry = self.lists.get(ms)
            if entry is None:
                if len(self.lists) >= MAX_LISTS:
                    continue
                entry = self.lists[ms] = ListEntry(mi, tl)
                if tl.hashes != entry.canon:
                    self._hold(entry, rec, root, tl)
                continue
            if not entry.conflicted:
                if tl.hashes == entry.first:
                    if tl.hashes != entry.canon:
                        self._hold(entry, rec, root, tl)
                    continue
                entry.conflicted = True
            moved.setdefault(mi, []).append(tl.region)
            if tl.hashes != entry.canon:
                ops.append(self._list_op(entry, rec, tl))
        return moved

    def _hold(self, entry: ListEntry, rec: Record, root: int, tl: TextList) -> None:
        """Keep a record sent in its list's first order (not the canonical one) until a second order shows
        the list is a breaker; past HOLD_CHARS the entry stops holding (its records stay as sent)."""
        if entry.held is None:
            return
        chars = sum(len(nz.message_text(m)) for m in rec.messages or [])
        if self.held_chars + chars > HOLD_CHARS:
            entry.held = None
            return
        self.held_chars += chars
        entry.held.append((rec, root, tl))

    def _list_op(self, entry: ListEntry, rec: Record, tl: TextList) -> tuple[tuple, tuple]:
        """The rewrite of one request's list to the canonical order, and its finding key."""
        tenant = rec.tenant or ""
        key = ("order", tenant, LIST_KIND, entry.mi, tl.ordinal, tl.sort_key or "")
        if key not in self.accs:
            first = first_difference(tl.hashes, entry.canon)
            what = f"JSON objects, `fix` sorts them by `{tl.sort_key}`" if tl.sort_key else "text chunks"
            role = (rec.messages or [])[entry.mi].get("role", "")
            acc = self._acc(key, tenant, entry.mi, role, "",
                            f"{LIST_KIND}: same {len(tl.hashes)} items ({what}), item {first} differs",
                            rec.request_id, tl.spans[first][0], rec)
            acc.detail = (f"{len(tl.hashes)} JSON objects sorted by `{tl.sort_key}`" if tl.sort_key
                          else LIST_UNSAFE)
        acc = self.accs[key]
        acc.observe(LIST_KIND, str(tl.hashes))
        acc.add_request(rec.request_id)
        return ("list_reorder", entry.mi, entry.canon, tl.sort_key is not None), key

    def retro_lists(self) -> None:
        """Rewrite the requests held in a list's first order once a later request showed another order
        (their other operations, if any, are kept)."""
        for entry in self.lists.values():
            if not entry.conflicted or not entry.held:
                continue
            for rec, root, tl in entry.held:
                extra = self._list_op(entry, rec, tl)
                sid = self.ops_of.get(rec.request_id)
                old = [] if sid is None else list(zip(self.opsets[sid][0], (self.keys[i] for i in self.opsets[sid][1]),
                                                      strict=True))
                self._queue(rec, root, [*old, extra])
            entry.held = []
        self.held_chars = 0


class ListEntry:
    """What is known about one multiset of list items: its first order, its canonical order, whether a
    second order was seen, and the records held in the first order until then (None: bound reached)."""

    __slots__ = ("mi", "first", "canon", "conflicted", "held")

    def __init__(self, mi: int, tl: TextList) -> None:
        self.mi = mi
        self.first = tl.hashes
        self.canon = tl.canonical
        self.conflicted = False
        self.held: list[tuple[Record, int, TextList]] | None = []
