"""Which candidate paths of each field can match a record of a given layout, computed once per layout.

`shapes.normalise` looks up 13 fields through about 70 candidate paths (`FIELD_CANDIDATES`) in one to
three holder objects: tried one by one, that was most of the read stage's Python time. A candidate can
only be non-null when its first path part is a key of the holder (`get_path` starts with a dict lookup),
so for one layout (the keys of each holder) the candidates worth trying are fixed. A log's records share a
few layouts: the plan is built on the first record of each and reused. The result is the same first
non-null candidate, in the same order (candidate, then holder); `tests/test_fieldplan.py` checks it against
the plain loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Plan = dict[str, tuple[tuple[str, bool, int], ...]]  # field -> (path, dotted, holder index) to try, in order


class FieldPlans:
    """Plans per holder layout for one candidate table (bounded: cleared when `limit` layouts are held)."""

    def __init__(self, candidates: Mapping[str, tuple[str, ...]], limit: int = 4096) -> None:
        self.paths = {f: tuple((p, "." in p, p.split(".", 1)[0]) for p in c) for f, c in candidates.items()}
        self.limit = limit
        self.plans: dict[tuple[tuple[Any, ...], ...], Plan] = {}

    def plan(self, holders: tuple[dict[str, Any], ...]) -> Plan:
        """The candidates of every field that can be non-null in these holders, in lookup order."""
        key = tuple(tuple(h) for h in holders)
        got = self.plans.get(key)
        if got is None:
            keysets = [set(k) for k in key]
            got = {f: tuple((path, dotted, i) for path, dotted, first in ps for i, ks in enumerate(keysets)
                            if first in ks)
                   for f, ps in self.paths.items()}
            if len(self.plans) >= self.limit:
                self.plans.clear()
            self.plans[key] = got
        return got
