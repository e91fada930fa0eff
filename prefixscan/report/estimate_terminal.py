"""Render an EstimateResult for a terminal with rich. Rendering only: every number comes from the result."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefixscan.cost.verdict import gpus_text
from prefixscan.report.escape import safe
from prefixscan.report.fmt import opt_pct as _pct
from prefixscan.report.fmt import print_tables

if TYPE_CHECKING:
    from rich.console import Console

    from prefixscan.cost.estimator import EstimateResult, Scenario

_LABELS = {"no_reuse": "no reuse", "today": "today (engine)", "round_robin": "round robin",
           "prefix_aware": "prefix-aware", "ideal": "ideal cache"}
# Column headers say what the cells hold (docs/estimate.md, "Columns").
COLUMNS = ("routing", "requests with a hit", "prompt tokens cached", "of ideal", "prefill tok/s", "GPUs",
           "$/month", "basis")
# Each sensitivity row's assumption: its label and its value's format.
_SENSITIVITY = {"capture_of_ideal": ("prefix-aware: share of ideal hits", "{:.0%}"), "mfu": ("MFU", "{:.0%}"),
                "usd_per_gpu_hour": ("$/GPU-hour", "${:.2f}")}


def _usd(x: float) -> str:
    if abs(x) >= 1e6:
        return f"${x / 1e6:,.2f}M"
    if abs(x) >= 1e3:
        return f"${x / 1e3:,.0f}k"
    return f"${x:,.0f}"


def _row(s: Scenario) -> list[str]:
    return [safe(_LABELS.get(s.name, s.name)), _pct(s.hit_rate), _pct(s.hit_rate_token_weighted),
            _pct(s.capture_of_ideal), f"{s.prefill_tokens_s:,.0f}", gpus_text(s.gpus), _usd(s.usd_per_month),
            s.basis]


def render(result: EstimateResult, console: Console) -> None:
    """Print the summary, scenario table, TTFT, simulated policies, sensitivity and verdict."""
    from rich.panel import Panel

    r, wl, sp = result, result.workload, result.spec
    m, g = sp.model, sp.gpu
    out = wl.output_tokens
    console.print(f"[bold]Scenario:[/] {safe(r.spec.describe())}", highlight=False)
    console.print(
        f"[bold]{safe(m.name)}[/] ({m.active_params / 1e9:.1f}B active) in {safe(sp.dtype)} on {safe(g.name)}, "
        f"MFU {sp.mfu:.0%}"
        f"{', linear FLOPs (no attention term)' if r.linear else ''}: "
        f"{r.per_gpu_prefill_tokens_s:,.0f} prefill tok/s per GPU, ${g.usd_per_hour:.2f}/GPU-hour")
    console.print(
        f"Traffic ({'measured from ' + safe(wl.source) if wl.source != 'flags' else 'from flags'}): "
        f"{wl.rps:,.4g} req/s, context {wl.context_tokens:,.0f} tokens, "
        f"new {wl.new_tokens:,.0f} tokens/request"
        + (f", output {out:,.0f} tokens" if out is not None else "")
        + f"; {sp.replicas} replicas x TP{sp.tensor_parallel}")
    if wl.ideal_hit_rate_token_weighted is not None:
        console.print("Ideal-cache hit rate (token-weighted, whole log): "
                      f"{wl.ideal_hit_rate_token_weighted:.1%}")
    console.print(f"KV cache: {r.kv_bytes_per_token / 1024:,.1f} KiB/token in {safe(sp.kv_dtype)}, "
                  f"{sp.kv_tokens_per_replica:,} tokens per replica")

    console.print(f"Round robin and router from: {safe(r.baseline_basis)} ({safe(r.baseline_detail)})", highlight=False)
    # row labels and numbers never cut (report/fmt.py), split when too wide; the basis folds
    print_tables(console, "Prefill GPUs by routing", list(COLUMNS), [_row(s) for s in r.scenarios], text={"basis"},
                 justify={"basis": "left"})
    pa, sq = r.scenario("prefix_aware"), r.scenario(r.status_quo)
    console.print(f"Prefix-aware from: {safe(pa.source)}")
    if r.engine is not None:
        console.print("Today vs modelled round robin: " + safe(" ".join(r.engine.explanation)), highlight=False)
    vs_rr = "" if r.status_quo == "round_robin" else f"vs round robin {_usd(r.monthly_savings_vs_round_robin_usd)}; "
    console.print(
        f"[bold]Saving vs {_LABELS[r.status_quo]}: {gpus_text(sq.gpus - pa.gpus)} GPUs = "
        f"{r.monthly_gpu_hours_saved:,.0f} GPU-hours = {_usd(r.monthly_savings_usd)} per month[/] "
        f"({vs_rr}vs no reuse {_usd(r.monthly_savings_vs_no_reuse_usd)}; {r.hours_per_month:g} h/month)")
    console.print(
        f"TTFT under load: hit {r.ttft_hit_s:.2f} s, miss {r.ttft_miss_s:.2f} s; "
        f"idle replica (TP{sp.tensor_parallel}): hit {r.ttft_idle_hit_s:.2f} s, "
        f"miss {r.ttft_idle_miss_s:.2f} s")
    if r.prefill_share is not None:
        console.print(f"Prefill share of GPU time under {_LABELS[r.status_quo]}: {r.prefill_share:.0%}")

    if r.policies:
        print_tables(console, f"Replayed policies ({safe(r.baseline_basis)})",
                     ["policy", "requests with a hit", "prompt tokens cached", "GPUs", "$/month", "TTFT p50",
                      "TTFT p95"],
                     [[safe(s.name), _pct(s.hit_rate), _pct(s.hit_rate_token_weighted), gpus_text(s.gpus),
                       _usd(s.usd_per_month), "-" if s.ttft_p50_s is None else f"{s.ttft_p50_s:.2f} s",
                       "-" if s.ttft_p95_s is None else f"{s.ttft_p95_s:.2f} s"] for s in r.policies])

    print_tables(console, "Sensitivity (one assumption moved at a time)",
                 ["assumption", "value", "prefix-aware GPUs", "saving/month"],
                 [[_SENSITIVITY[row.parameter][0], _SENSITIVITY[row.parameter][1].format(row.value),
                   gpus_text(row.gpus_prefix_aware), _usd(row.monthly_savings_usd)] for row in r.sensitivity])

    v = r.verdict
    style = {True: "green", False: "red", None: "yellow"}[v.worth_it]
    body = safe(v.headline) + "\n" + "\n".join(f"- {safe(reason)}" for reason in v.reasons)
    console.print(Panel(body, title="Verdict", border_style=style))
    for note in r.notes:
        console.print(f"[dim]note: {safe(note)}[/]")
