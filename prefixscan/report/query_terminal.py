"""A query result as a rich table that keeps its numbers whole on a narrow terminal.

Number columns never wrap or shrink below their widest value; text columns fold onto more lines instead.
Every value and column name is printed through `safe` (Rich markup, control characters).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rich.table import Table

from prefixscan.report.escape import safe


def cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return safe(v)


def _numeric(values: list[Any]) -> bool:
    seen = [v for v in values if v is not None]
    return bool(seen) and all(isinstance(v, int | float | Decimal) and not isinstance(v, bool) for v in seen)


def result_table(cols: list[str], rows: list[tuple[Any, ...]], width: int | None = None) -> Any:
    """The rows as a table; numeric columns right-aligned, unbreakable and as wide as their widest cell.
    When those cannot fit in `width` columns, one block per row (column: value) instead: a narrow
    terminal gets longer output, never a cut or dropped number."""
    shown = [[cell(v) for v in r] for r in rows]
    numeric = [_numeric([r[i] for r in rows]) for i in range(len(cols))]
    need = sum((max([len(cols[i])] + [len(r[i]) for r in shown]) if numeric[i] else min(len(cols[i]), 8)) + 3
               for i in range(len(cols)))
    if width is not None and need > width and len(cols) > 1:
        return _records(cols, shown)
    t = Table(show_edge=False)
    for i, c in enumerate(cols):
        if numeric[i]:
            t.add_column(safe(c), justify="right", no_wrap=True,
                         min_width=max([len(c)] + [len(r[i]) for r in shown]))
        else:
            t.add_column(safe(c), overflow="fold")
    for r in shown:
        t.add_row(*r)
    return t


def _records(cols: list[str], shown: list[list[str]]) -> Any:
    from rich.console import Group

    blocks = []
    for n, r in enumerate(shown, start=1):
        t = Table(show_header=False, show_edge=False, box=None, title=f"row {n}", title_justify="left")
        t.add_column(no_wrap=True)
        t.add_column(overflow="fold")
        for c, v in zip(cols, r, strict=True):
            t.add_row(safe(c), v)
        blocks.append(t)
    return Group(*blocks)
