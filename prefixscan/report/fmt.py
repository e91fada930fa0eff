"""Formatting shared by the terminal reporters: absolute tokens first, percentages named; every table laid
out so no number is cut. Data values are printed through `escape.safe` / `escape.clean`."""

from __future__ import annotations

from typing import Any


def pct(x: float) -> str:
    """0.417 -> '41.7%'."""
    return f"{100 * x:.1f}%"


def opt_pct(x: float | None) -> str:
    """A rate that one side of a comparison may lack: '-' when absent."""
    return "-" if x is None else pct(x)


def points(a: float | None, b: float | None) -> str:
    """The change from a to b in percentage points: 0.476 -> 0.599 is '+12.3 pts'."""
    return "-" if a is None or b is None else f"{100 * (b - a):+.1f} pts"


def tokens(n: float | None) -> str:
    """Token counts with a unit: 57410 -> '57.41k'; None -> '-'."""
    if n is None:
        return "-"
    n = float(n)
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def say(console: Any, *lines: str | None) -> None:
    """Print each sentence on a line of its own, wrapped by the terminal (never cut), its numbers not
    highlighted; a None (nothing to say) prints nothing."""
    for line in lines:
        if line:
            console.print(line, soft_wrap=True, highlight=False)


def _add_columns(t: Any, columns: list[str], rows: list[list[str]], text: set[str] | frozenset[str],
                 keys: int = 0, justify: dict[str, str] | None = None, fixed: bool = False) -> None:
    """The column rule of every terminal table: a number column never wraps and never shrinks below its
    widest cell; a `text` column folds onto more lines; the first `keys` columns (row labels such as a
    policy name) are whole. `fixed` (a table that needs all the width it can get) gives each number column
    exactly its widest cell (or its title's longest word) and lets its title wrap at spaces, so the
    table's width is known before rich lays it out and nothing is left for rich to cut."""
    from rich.text import Text

    for i, c in enumerate(columns):
        widest = max([Text.from_markup(r[i]).cell_len for r in rows], default=0)
        align = (justify or {}).get(c, "right")
        if c in text:
            t.add_column(c, overflow="fold", justify=(justify or {}).get(c, "left"))
        elif i < keys:
            t.add_column(c, no_wrap=True, min_width=max(widest, len(c)))
        elif fixed:
            t.add_column(c, justify=align, overflow="fold", width=max(widest, *(len(w) for w in c.split())))
        else:
            t.add_column(c, justify=align, no_wrap=True, min_width=max(widest, min(len(c), 8)))
    for r in rows:
        t.add_row(*r)


def number_tables(console: Any, title: str | None, columns: list[str], rows: list[list[str]], keys: int = 1,
                  text: frozenset[str] | set[str] = frozenset(), justify: dict[str, str] | None = None,
                  **table_options: Any) -> list[Any]:
    """`rows` as one rich table, or as several when the console is too narrow to show every column whole:
    each further table repeats the first `keys` columns and takes as many of the remaining columns as fit
    (`_add_columns` rule). Print each with `console.print`. The narrowest console this keeps whole is one
    that fits the key columns and the widest other column (about 40 columns for the simulate tables)."""
    from rich.measure import Measurement
    from rich.table import Table

    def build(cols: list[int], part: int, fixed: bool = True) -> Any:
        t = Table(title=title if part == 0 or title is None else f"{title} (continued)", title_justify="left",
                  **table_options)
        _add_columns(t, [columns[i] for i in cols], [[r[i] for i in cols] for r in rows], text, keys, justify,
                     fixed)
        return t

    def measure(t: Any) -> Measurement:
        return Measurement.get(console, console.options.update_width(10_000), t)

    natural = build(list(range(len(columns))), 0, fixed=False)
    if measure(natural).maximum <= console.width:  # room for every column at its full width
        return [natural]
    tables: list[Any]
    head, tables, current = list(range(keys)), [], list(range(keys))
    for i in range(keys, len(columns)):
        if len(current) > keys and measure(build([*current, i], len(tables))).minimum > console.width:
            tables.append(build(current, len(tables)))
            current = [*head]
        current.append(i)
    tables.append(build(current, len(tables)))
    return tables


def print_tables(console: Any, title: str | None, columns: list[str], rows: list[list[str]], keys: int = 1,
                 text: frozenset[str] | set[str] = frozenset(), caption: str | None = None,
                 **table_options: Any) -> None:
    """Print `number_tables(...)`, with `caption` under the last part."""
    tables = number_tables(console, title, columns, rows, keys=keys, text=text, **table_options)
    tables[-1].caption = caption
    for t in tables:
        console.print(t)


def metric(value: Any, kind: str) -> str:
    """Format one simulate metric value (`kind`: pct, s, x, int, short, f1); missing values show as an en dash."""
    if value is None:
        return "–"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "s":
        return f"{value * 1000:,.0f} ms" if value < 1 else f"{value:,.2f} s"
    if kind == "x":
        return f"{value:.2f}x"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "short":
        v = float(value)
        for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(v) >= div:
                return f"{v / div:.3g}{unit}"
        return f"{int(v)}"
    if kind == "f1":
        return f"{value:,.1f}"
    return f"{value:.2f}"


def print_comparison(console: Any, title: str, columns: list[str], rows: list[list[str]], keys: int = 1) -> None:
    """A simulate comparison table, split into parts when the terminal is too narrow (numbers are never cut)."""
    from rich import box

    for t in number_tables(console, title, columns, rows, keys=keys, box=box.SIMPLE_HEAD, pad_edge=False):
        console.print(t)
