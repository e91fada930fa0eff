"""Formatting shared by the terminal reporters: absolute tokens first, percentages named; data values
made safe to print (`safe`, `clean`)."""

from __future__ import annotations

from typing import Any

from prefixscan.report.escape import rich, terminal


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


# Terminal safety: a value from the data (tenant, file name, snippet, example, SQL result) is printed only
# through `safe` (Rich markup) or `clean` (plain text), the terminal helpers of `prefixscan.report.escape`:
# escape sequences from the data could otherwise clear the screen, write the clipboard (OSC 52), plant
# live hyperlinks (OSC 8), rewrite earlier output (\r, \b) or reorder it (bidi overrides), and `[...]`
# would be read as Rich markup. Control characters are shown as `\xNN` / `\uNNNN`, never acted on.


def clean(value: object) -> str:
    """`value` as one line of plain printable text: control characters made visible (`\x1b`), tabs and
    newlines become spaces (`escape.terminal`)."""
    return terminal(value)


def safe(value: object) -> str:
    """`clean(value)` escaped for Rich markup, for any data value inside a printed string or table cell."""
    return rich(value)


def plain(value: object) -> str:
    """`clean(value)` for text printed with markup off (or in a `rich.text.Text`); None prints as "None"."""
    return terminal(str(value))


def numbers_table(title: str | None, columns: list[str], rows: list[list[str]], text: set[str]) -> Any:
    """A rich table whose number columns never wrap or shrink below their widest cell (a narrow terminal
    folds the `text` columns onto more lines instead: a cut number would be a wrong number)."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_edge=False)
    for i, c in enumerate(columns):
        if c in text:
            t.add_column(c, overflow="fold")
        else:
            widest = max([len(r[i]) for r in rows], default=0)
            t.add_column(c, justify="right", no_wrap=True, min_width=max(widest, min(len(c), 8)))
    for r in rows:
        t.add_row(*r)
    return t
