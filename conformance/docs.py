"""The measured section of docs/conformance.md, rewritten by every `make conformance` between two markers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- conformance:begin (written by make conformance) -->", "<!-- conformance:end -->"


def differences(rows: list[dict[str, Any]], limit: int = 4) -> list[str]:
    """Every run with differences: counts per (what, cause), and the first few requests."""
    out = []
    for r in rows:
        if not r["diffs"]:
            continue
        pool = f"pool {r['pool_blocks']:,}" if r["bounded"] else "unbounded"
        out.append(f"- **{r['family']} {r['kind']} block {r['block_size']} {pool}**:")
        for (what, cause), n in sorted(Counter((d["what"], d["cause"]) for d in r["diffs"]).items()):
            out.append(f"  - {n} x {what}: {cause}")
        shown = ", ".join(f"{d['request']} ({d['what']}: vLLM {d['engine']}, prefixscan {d['prefixscan']})"
                          for d in r["diffs"][:limit])
        more = f" and {len(r['diffs']) - limit} more" if len(r["diffs"]) > limit else ""
        out.append(f"  - requests: {shown}{more}")
    return out or ["- none: every request of every run agrees."]


def section(rows: list[dict[str, Any]], sizes: dict[str, Any], dve: dict[str, Any]) -> str:
    from conformance.compare import table, tokenizer_table

    lines = [BEGIN, "", table(rows), "",
             f"vLLM's scheduler driver against the real engine, both at block 32 with the same pools: "
             f"{dve['equal']:,} of {dve['requests']:,} requests equal (prompt ids, cached tokens, block hashes) "
             f"in {dve['runs']} runs.", "", "Prompt tokens, per family:", "", tokenizer_table(rows), "",
             "Pools per family (blocks; the engine refuses a pool smaller than max_model_len / block + 1):", ""]
    for fam, s in sizes.items():
        for bs in (32, 16):
            k = s[str(bs)]
            lines.append(f"- {fam}, block {bs}: distinct blocks {k['distinct_blocks']:,}, smallest pool accepted "
                         f"{k['min_pool']}, bounded pools {', '.join(map(str, k['pools']))}, unbounded "
                         f"{k['unbounded_pool']:,} (more than all the workload's blocks)")
    lines += ["", "Differences, with their causes:", "", *differences(rows), "", END]
    return "\n".join(lines)


def write(path: Path, rows: list[dict[str, Any]], sizes: dict[str, Any], dve: dict[str, Any]) -> None:
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: the markers of the measured section are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + section(rows, sizes, dve) + tail, encoding="utf-8")
