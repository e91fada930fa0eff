"""A query result as a rich table that keeps its numbers whole on a narrow terminal.

Number columns never wrap or shrink below their widest value; text columns fold onto more lines instead.
Every value and column name is printed through `safe` (Rich markup, control characters).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rich.table import Table

from prefixscan.report.fmt import safe


def cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return safe(v)


def _numeric(values: list[Any]) -> bool:
    seen = [v for v in values if v is not None]
    return bool(seen) and all(isinstance(v, int | float | Decimal) and not isinstance(v, bool) for v in seen)


def result_table(cols: list[str], rows: list[tuple[Any, ...]]) -> Table:
    """The rows as a table; numeric columns right-aligned, unbreakable and as wide as their widest cell."""
    t = Table(show_edge=False)
    shown = [[cell(v) for v in r] for r in rows]
    for i, c in enumerate(cols):
        if _numeric([r[i] for r in rows]):
            width = max([len(c)] + [len(r[i]) for r in shown])
            t.add_column(safe(c), justify="right", no_wrap=True, min_width=width)
        else:
            t.add_column(safe(c), overflow="fold")
    for r in shown:
        t.add_row(*r)
    return t
