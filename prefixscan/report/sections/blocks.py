"""The block type every report section returns, and the number formats the sections share."""

from __future__ import annotations

from prefixscan.cost.verdict import gpus_text
from prefixscan.report.escape import data as esc
from prefixscan.report.model import ReportData

# ("h", level, text) | ("p", text) | ("ul"/"ol", [text]) | ("table", head, rows) | ("fig", name) | ("code", text)
# | ("missing", text)
Block = tuple

def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}%}"


def tok(x: float | None) -> str:
    """Token counts: 1,234 below 10k, then 54.10k / 12.3M style, always absolute."""
    if x is None:
        return "n/a"
    for div, suf in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= 10 * div or (div > 1e3 and abs(x) >= div):
            return f"{x / div:,.2f}{suf}"
    return f"{x:,.0f}"


def num(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def gpus(x: float | None) -> str:
    """GPU counts as every printer shows them (cost.verdict.gpus_text)."""
    return "n/a" if x is None else gpus_text(x)


def sec(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1000:,.0f} ms" if abs(x) < 1 else f"{x:,.2f} s"


def usd(x: float | None) -> str:
    return "n/a" if x is None else f"${x:,.0f}"


def gib(x: float | None) -> str:
    return "n/a" if x is None else (f"{x:,.1f} GiB" if x >= 10 else f"{x:,.2f} GiB")


def missing_block(data: ReportData, key: str, what: str) -> Block:
    return (
        "missing",
        f"No {what} in this run: run `{esc(data.missing[key])}` to fill this section, then "
        f"`prefixscan report {esc(data.run_path)}` again.",
    )


def estimate_missing(data: ReportData) -> str:
    err = (data.estimate_error or "no data").rstrip(".")
    if "--replicas" in err:
        return (
            f"The cost estimate needs a replica count: run `{esc(data.missing['estimate'])}` to fill this "
            f"section, or pass `--replicas N` to `prefixscan report {esc(data.run_path)}`."
        )
    return f"The cost estimate could not run on this traffic: {err}."
