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
