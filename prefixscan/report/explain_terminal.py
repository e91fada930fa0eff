"""Terminal rendering of `prefixscan explain`: one request's blocks, divergence, findings and miss split."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from prefixscan.report.escape import safe
from prefixscan.report.fmt import say


def _e(v: Any) -> str:
    """Escaped for Rich (log values may hold markup or control characters); "-" when absent."""
    return "-" if v is None else safe(v)


def _runs_table(ex: dict[str, Any]) -> Table:
    t = Table(title="Blocks", title_justify="left", show_edge=False)
    for col in ("blocks", "tokens", "outcome", "first computed by", "tenant", "conversation"):
        t.add_column(col)
    b = ex["block_size"]
    for r in ex["runs"]:
        span = f"{r['first']}" if r["first"] == r["last"] else f"{r['first']}-{r['last']}"
        toks = f"{r['first'] * b}-{min((r['last'] + 1) * b, ex['prompt_tokens']) - 1}"
        t.add_row(span, toks, r["status"], _e(r["first_request_id"]), _e(r["first_tenant"]),
                  _e(r["first_conversation_id"]))
    return t


def _divergence_lines(d: dict[str, Any] | None) -> list[str]:
    if d is None:
        return ["diverged: nowhere (every block was computed before)"]
    out = [f"diverged from {_e(d['against_request_id'] or 'every earlier request')} at token {d['token']} "
           f"(block {d['block']})"]
    if d.get("message_index") is not None:
        out.append(f"  in message {d['message_index']} ({_e(d['role'])}), char {d['char_offset']}: this message "
                   f"{d['this_length']} chars (hash {d['this_hash']}), the earlier one {d['other_length']} chars "
                   f"(hash {d['other_hash']})")
    if d.get("this_text") is not None:
        out.append(f"  here:    {_e(d['this_text'])!s}")
        out.append(f"  earlier: {_e(d['other_text'])!s}")
    if d.get("note"):
        out.append(f"  note: {_e(d['note'])}")
    return out


def _misses_line(m: dict[str, Any] | None) -> str | None:
    if not m:
        return None
    parts = [f"{k.removeprefix('lost_').removesuffix('_tokens')} {m[k]:,}" for k in
             ("lost_breaker_tokens", "lost_routing_tokens", "lost_eviction_tokens", "lost_unexplained_tokens")
             if m.get(k) is not None]
    actual = "-" if m.get("actual_cached_tokens") is None else f"{m['actual_cached_tokens']:,}"
    replica = "-" if m.get("replica_cached_tokens") is None else f"{m['replica_cached_tokens']:,}"
    return (f"misses: counterfactual {m['counterfactual_cached_tokens']:,} >= ideal {m['ideal_cached_tokens']:,} "
            f">= replica {replica} >= engine {actual} cached tokens; lost to " + ", ".join(parts))


def render_explanation(ex: dict[str, Any], console: Console) -> None:
    """Print an Explanation (its `to_json()` dict)."""
    inferred = " (inferred)" if ex["conversation_inferred"] else ""
    console.print(f"request {_e(ex['request_id'])} (seq {ex['seq']}): tenant {_e(ex['tenant'])}, conversation "
                  f"{_e(ex['conversation_id'])}{inferred}, replica {_e(ex['replica'])}", highlight=False)
    console.print(f"{ex['prompt_tokens']:,} prompt tokens in {ex['blocks']} blocks of {ex['block_size']}; ideal cache "
                  f"hits {ex['cached_tokens']:,} ({ex['hit_source']}, {ex['prefix_class']})", highlight=False)
    console.print(_runs_table(ex))
    say(console, *_divergence_lines(ex["divergence"]))
    for f in ex["findings"]:
        mark = " <- at the divergence" if f["at_divergence"] else ""
        say(console, f"finding #{f['rank']} {f['kind']} (message {f['message_index']}, char {f['char_offset']}): "
                     f"its fix gains {f['tokens_gained']:,} tokens here{mark}. {_e(f['fix'])}")
    say(console, _misses_line(ex.get("misses")))
