"""Terminal and JSON rendering of `check` gates and `diff` comparisons (prefixscan.compare results)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from prefixscan.compare.check import CheckResult
from prefixscan.compare.diff import DiffResult
from prefixscan.compare.pilot import PilotComparison, pilot_json
from prefixscan.report.escape import clean, safe
from prefixscan.report.fmt import number_tables, opt_pct, points
from prefixscan.report.fmt import tokens as tok


def check_lines(result: CheckResult, quiet: bool = False) -> list[str]:
    """One line per gate (only the failed ones when quiet), then a verdict line."""
    lines = [f"{g.status} {g.name}: {clean(g.message)}"
             for g in result.gates if not (quiet and g.passed and g.checkable)]
    n_fail, n_unchecked = len(result.failed), len(result.uncheckable)
    unchecked = f" ({n_unchecked} not checkable)" if n_unchecked else ""
    lines.append(f"check passed: {len(result.gates) - n_unchecked} gate(s) held{unchecked}" if result.passed else
                 f"check failed: {n_fail} of {len(result.gates)} gate(s) failed{unchecked}")
    return lines


def _tables(console: Console, title: str, columns: list[str], rows: list[list[str]], keys: int,
            text: set[str]) -> list[Table]:
    """Row labels and data fold, numbers stay whole (report/fmt.py), split when the terminal is too narrow."""
    left = {c: "left" for c in text}
    return number_tables(console, title, columns, rows, keys=keys, text=text, justify=left, show_edge=False)


def _rates_table(r: DiffResult, console: Console) -> list[Table]:
    return _tables(console, "Ideal-cache hit rate (B - A)", ["definition", "A", "B", "change"],
                   [[name.replace("_", " "), opt_pct(a), opt_pct(b), points(a, b)] for name, a, b in r.rates],
                   1, {"definition"})


def _groups_table(r: DiffResult, dimension: str, console: Console) -> list[Table]:
    rows = [g for g in r.groups if g.dimension == dimension]
    if not rows:
        return []
    return _tables(console, f"Token-weighted hit rate by {dimension.replace('_', ' ')}",
                   ["key", "requests A", "requests B", "A", "B", "change"],
                   [[safe(g.key), "-" if g.requests_a is None else f"{g.requests_a:,}",
                     "-" if g.requests_b is None else f"{g.requests_b:,}", opt_pct(g.rate_a), opt_pct(g.rate_b),
                     points(g.rate_a, g.rate_b)] for g in rows], 1, {"key"})


def _breakers_table(r: DiffResult, console: Console) -> list[Table]:
    if not r.breakers:
        return []
    rows = []
    for c in r.breakers:
        b = c.breaker
        where = "tools" if b.message_index == -1 else (
            "-" if b.message_index is None else f"message {b.message_index} ({b.role})")
        label = f"{b.kind} ({b.label})" if b.label else b.kind
        rows.append([c.status, safe(label), safe(b.tenant or "(none)"), safe(where), tok(c.tokens_lost_a),
                     tok(c.tokens_lost_b)])
    return _tables(console, "Cache breakers", ["status", "kind", "tenant", "where", "tokens lost A", "tokens lost B"],
                   rows, 2, {"status", "kind", "tenant", "where"})


def prefill_line(r: DiffResult) -> str:
    """Computed prefill per request (ideal cache) in each run, and GPUs when a scenario was given."""
    a, b = r.prefill_a, r.prefill_b
    line = (f"prefill computed (ideal cache): A {tok(a.computed_tokens)} of {tok(a.prompt_tokens)} tokens "
            f"({a.computed_per_request:,.0f}/request), B {tok(b.computed_tokens)} of {tok(b.prompt_tokens)} "
            f"({b.computed_per_request:,.0f}/request)")
    if a.gpus is not None and b.gpus is not None:
        line += f"; prefill GPUs at {r.scenario}: A {a.gpus:,.1f}, B {b.gpus:,.1f} ({b.gpus - a.gpus:+,.1f})"
    return line


def render_diff(r: DiffResult, console: Console) -> None:
    """The comparison as tables: rates, per tenant and class, breakers, prefill."""
    console.print(f"diff  A = {clean(r.a.path)} ({r.a.requests:,} requests)  B = {clean(r.b.path)} "
                  f"({r.b.requests:,} requests)", markup=False)
    for w in r.warnings:
        console.print(f"warning: {clean(w)}", markup=False)
    tables = _rates_table(r, console) + _groups_table(r, "tenant", console) + _groups_table(r, "prefix_class", console)
    breakers = _breakers_table(r, console)
    for t in tables + breakers:
        console.print(t)
    if not breakers:
        console.print("cache breakers: not compared (a run has no findings table)" if r.breakers is None else
                      "cache breakers: none in either run", markup=False)
    console.print(prefill_line(r), markup=False)
    if r.pilot is not None:
        _pilot(r.pilot, console)


def _ms(v: float | None, signed: bool = False) -> str:
    return "-" if v is None else f"{v * 1000:{'+' if signed else ''},.0f} ms"


def _pilot(c: PilotComparison, console: Console) -> None:
    """Pilot against control: per class, requests, hit rate and TTFT / queue wait p50 / p95, with B - A."""
    console.print(f"pilot  A = {clean(c.a.label)}, {c.a.cached_source} classes  B = {clean(c.b.label)}, "
                  f"{c.b.cached_source} classes", markup=False)
    for w in c.warnings:
        console.print(f"warning: {clean(w)}", markup=False)
    data = pilot_json(c)["groups"]
    rows = []
    for g, d in data.items():
        n = d["requests"]
        rows.append([g, "requests", f"{n['a']:,}", f"{n['b']:,}", f"{n['delta']:+,}"])
        if g == "all":
            h, u = d["hit_rate"], d["uncached_tokens"]
            rows.append([g, "hit rate", opt_pct(h["a"]), opt_pct(h["b"]), points(h["a"], h["b"])])
            rows.append([g, "prefill tokens", tok(u["a"]), tok(u["b"]), f"{u['delta']:+,}"])
        else:
            s = d["share"]
            rows.append([g, "share of requests", opt_pct(s["a"]), opt_pct(s["b"]), points(s["a"], s["b"])])
        for k, name in (("ttft_p50_s", "TTFT p50"), ("ttft_p95_s", "TTFT p95"), ("queue_wait_p50_s", "queue p50"),
                        ("queue_wait_p95_s", "queue p95")):
            v = d[k]
            rows.append([g, name, _ms(v["a"]), _ms(v["b"]), _ms(v["delta"], signed=True)])
    for t in _tables(console, "Pilot: A against B by class (B - A)", ["class", "measure", "A", "B", "change"],
                     rows, 2, {"class", "measure"}):
        console.print(t)


def diff_json(r: DiffResult) -> dict[str, Any]:
    """The comparison as plain data (what `diff --json` prints)."""
    def prefill(p: Any) -> dict[str, Any]:
        return {"requests": p.requests, "prompt_tokens": p.prompt_tokens, "computed_tokens": p.computed_tokens,
                "computed_per_request": p.computed_per_request, "gpus": p.gpus}

    return {
        "a": r.a.path, "b": r.b.path, "warnings": list(r.warnings), "scenario": r.scenario,
        "hit_rates": [{"definition": k, "a": a, "b": b, "delta": None if a is None or b is None else b - a}
                      for k, a, b in r.rates],
        "groups": [{"dimension": g.dimension, "key": g.key, "requests_a": g.requests_a, "requests_b": g.requests_b,
                    "a": g.rate_a, "b": g.rate_b, "delta": g.delta} for g in r.groups],
        "breakers": None if r.breakers is None else [
            {"status": c.status, "kind": c.breaker.kind, "tenant": c.breaker.tenant, "label": c.breaker.label,
             "message_index": c.breaker.message_index, "role": c.breaker.role, "tokens_lost_a": c.tokens_lost_a,
             "tokens_lost_b": c.tokens_lost_b} for c in r.breakers],
        "prefill": {"a": prefill(r.prefill_a), "b": prefill(r.prefill_b)},
        **({"pilot": pilot_json(r.pilot)} if r.pilot is not None else {}),
    }
