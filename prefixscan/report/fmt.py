"""Number formatting shared by the terminal reporters: absolute tokens first, percentages named."""

from __future__ import annotations


def pct(x: float) -> str:
    """0.417 -> '41.7%'."""
    return f"{100 * x:.1f}%"


def tokens(n: float | None) -> str:
    """Token counts with a unit: 57410 -> '57.41k'; None -> '-'."""
    if n is None:
        return "-"
    n = float(n)
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


# C0 and C1 control characters, DEL, and the bidi overrides/isolates that reorder what a terminal shows.
_UNSAFE = dict.fromkeys([*range(0x00, 0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)])


def plain(value: object) -> str:
    """A value from the data made safe to print: control characters (escape sequences) removed.

    Print it with markup off, or wrap it in `rich.text.Text`, so Rich markup in the data stays text.
    """
    return str(value).translate(_UNSAFE)
