"""Report figures: matplotlib (Agg) drawn from a ReportData, returned as deterministic SVG text.

Determinism: a fixed `svg.hashsalt`, text kept as text (`svg.fonttype: none`) and no Date metadata, so
the same run directory gives byte-identical figures. Every label from the data passes `escape.svg_text`
(controls visible; no mathtext), and the document passes `escape.xml_legal`, so each SVG is valid XML.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefixscan.report.escape import svg_text, xml_legal

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

    from prefixscan.report.model import ReportData

RC: dict[RcKeyType, Any] = {
    "svg.hashsalt": "prefixscan-report",
    "svg.fonttype": "none",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.dpi": 100,
    "text.parse_math": False,  # a `$` in a tenant or model name is text, never mathtext
}
BLUE, ORANGE, GREEN, GREY, RED = "#1f77b4", "#ff7f0e", "#2ca02c", "#7f7f7f", "#d62728"
SCENARIO_LABELS = {"no_reuse": "no reuse", "today": "today (engine-reported)", "round_robin": "round robin",
                   "prefix_aware": "prefix-aware", "ideal": "ideal cache"}


@dataclass(frozen=True)
class Figure:
    """One figure: a stable name (file stem and HTML id), an alt text and the SVG document."""

    name: str
    alt: str
    svg: str


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    return xml_legal(buf.getvalue())


def _tok_fmt(x: float, _pos: Any = None) -> str:
    for div, suf in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suf}"
    return f"{x:.3g}"


def capacity(data: ReportData) -> Figure | None:
    cap = data.capacity
    if cap is None or not cap.points:
        return None
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    x = [p["capacity_tokens"] for p in cap.points]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.plot(x, [p["lru_hit_rate"] for p in cap.points], color=BLUE, marker="o", ms=3, label="vLLM block pool (LRU)")
    ax.plot(x, [p["opt_hit_rate"] for p in cap.points], color=GREEN, marker="s", ms=3, label="optimal (Belady)")
    ax.plot(x, [p["ideal_hit_rate"] for p in cap.points], color=GREY, ls="--", label="ideal (unbounded)")
    if cap.replica_kv_tokens and x[0] <= cap.replica_kv_tokens <= x[-1]:
        ax.axvline(cap.replica_kv_tokens, color=RED, ls=":", lw=1.2,
                   label=f"one replica's KV ({_tok_fmt(cap.replica_kv_tokens)} tokens)")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_tok_fmt))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("cache capacity (tokens)")
    ax.set_ylabel("token-weighted hit rate")
    bpt = data.kv.bytes_per_token
    top = ax.secondary_xaxis("top", functions=(lambda t: t * bpt / 2**30, lambda g: g * 2**30 / bpt))  # type: ignore[operator]  # arrays
    top.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    top.set_xlabel(svg_text(f"KV memory (GiB, {data.kv.model} {data.kv.dtype})"))
    ax.legend(loc="lower right", fontsize=8)
    return Figure("capacity", "Capacity curve: token-weighted hit rate against cache size for LRU, optimal and ideal "
                  "caches", _svg(fig))


def _stacked(rows: list[dict[str, Any]], title: str) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = list(reversed(rows))
    keys = [svg_text(r["key"]) for r in rows]
    cached = [r["cached_tokens"] for r in rows]
    rest = [r["prompt_tokens"] - r["cached_tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, max(1.6, 0.32 * len(rows) + 1.0)))
    ax.barh(keys, cached, color=GREEN, label="cached (ideal cache)")
    ax.barh(keys, rest, left=cached, color=GREY, alpha=0.5, label="prefilled")
    for i, r in enumerate(rows):
        ax.text(r["prompt_tokens"], i, f" {r['token_weighted']:.0%}", va="center", fontsize=8)
    ax.xaxis.set_major_formatter(FuncFormatter(_tok_fmt))
    ax.set_xlabel("prompt tokens (label: token-weighted hit rate)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="y", visible=False)
    return fig


def reuse(data: ReportData, dimension: str, title: str) -> Figure | None:
    rows = data.breakdowns.get(dimension)
    if not rows:
        return None
    return Figure(f"reuse_{dimension}", f"Prompt tokens cached and prefilled by {title}",
                  _svg(_stacked(rows, f"Ideal-cache reuse by {title}")))


def turns(data: ReportData) -> Figure | None:
    rows = data.breakdowns.get("turn_index")
    if not rows or len(rows) < 2:
        return None
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    fig, ax = plt.subplots(figsize=(8, 3.2))
    keys = [svg_text(r["key"]) for r in rows]
    ax.bar(keys, [r["token_weighted"] for r in rows], color=BLUE)
    for i, r in enumerate(rows):
        ax.text(i, r["token_weighted"], f"{r['requests']:,}", ha="center", va="bottom", fontsize=7)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("turn index (label: requests)")
    ax.set_ylabel("token-weighted hit rate")
    ax.grid(axis="x", visible=False)
    return Figure("reuse_turn", "Token-weighted ideal-cache hit rate by conversation turn", _svg(fig))


def policies(data: ReportData) -> Figure | None:
    rows = data.policies
    if not rows:
        return None
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    rows = list(reversed(rows))
    names = [svg_text(r["policy"]) for r in rows]
    colors = [ORANGE if r["policy"] == data.best_policy else BLUE for r in rows]
    ys = range(len(rows))

    def val(r: dict[str, Any], k: str) -> float:
        return float(r[k] if r.get(k) is not None else 0.0)

    fig, axes = plt.subplots(2, 2, figsize=(9, max(4.5, 0.5 * len(rows) + 1.5)), sharey=True)
    (a, b), (c, d) = axes
    a.barh(names, [val(r, "hit_rate_token_weighted") for r in rows], color=colors)
    a.xaxis.set_major_formatter(PercentFormatter(1.0))
    a.set_title("cluster hit rate (token-weighted)", fontsize=9)
    b.barh([y + 0.2 for y in ys], [val(r, "ttft_p50_s") for r in rows], height=0.4, color=BLUE, label="p50")
    b.barh([y - 0.2 for y in ys], [val(r, "ttft_p95_s") for r in rows], height=0.4, color=ORANGE, label="p95")
    b.set_title("TTFT (s)", fontsize=9)
    b.legend(fontsize=7, loc="lower right")
    c.barh(names, [val(r, "imbalance_max_mean") for r in rows], color=colors)
    c.axvline(1.25, color=RED, ls=":", lw=1)
    c.set_title("load imbalance (max / mean outstanding); 1.25 = bounded-load cap", fontsize=9)
    d.barh(names, [val(r, "spill_rate") for r in rows], color=colors)
    d.xaxis.set_major_formatter(PercentFormatter(1.0))
    d.set_title("spill rate (left the warmest replica)", fontsize=9)
    for ax in axes.flat:
        ax.grid(axis="y", visible=False)
    fig.tight_layout()
    return Figure("policies", "Routing policies: hit rate, TTFT p50/p95, load imbalance and spill rate", _svg(fig))


def gpus(data: ReportData) -> Figure | None:
    est = data.estimate
    if not est or not est.get("scenarios"):
        return None
    import matplotlib.pyplot as plt

    sc = est["scenarios"]
    labels = [svg_text(SCENARIO_LABELS.get(s["name"], s["name"])) for s in sc]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    by_name = {"no_reuse": GREY, "today": RED, "round_robin": BLUE, "prefix_aware": ORANGE, "ideal": GREEN}
    colors = [by_name.get(s["name"], GREY) for s in sc]
    ax.bar(labels, [s["gpus"] for s in sc], color=colors)
    for i, s in enumerate(sc):
        ax.text(i, s["gpus"], f"{s['gpus']:,.1f} GPUs\n${s['usd_per_month']:,.0f}/mo", ha="center", va="bottom",
                fontsize=8)
    ax.set_ylabel(svg_text(f"prefill GPUs ({est.get('gpu', {}).get('name', '')})"))
    ax.set_ylim(top=max(s["gpus"] for s in sc) * 1.3 or 1)
    ax.grid(axis="x", visible=False)
    return Figure("gpus", "Prefill GPUs and monthly cost per routing scenario", _svg(fig))


def render_all(data: ReportData) -> dict[str, Figure]:
    """Every figure the data supports, by name, in report order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context(RC):
        figs = [reuse(data, "tenant", "tenant"), reuse(data, "prefix_class", "prefix class"), turns(data),
                capacity(data), policies(data), gpus(data)]
    return {f.name: f for f in figs if f is not None}
