"""Read a run directory's findings back (for `prefixscan findings` and scripts)."""

from __future__ import annotations

import os
from typing import Any

from prefixscan.errors import RunDirError
from prefixscan.run.load import load_run


def read_findings(run_dir: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(finding rows in rank order, counterfactual dict) of a run written by `prefixscan analyze -o`."""
    run = load_run(run_dir)
    if not run.has("findings"):
        raise RunDirError(f"run {run_dir} has no findings table: it was analysed with --no-findings, from a "
                          "hashed trace, or by an older version; re-run `prefixscan analyze LOGS -o RUN_DIR`")
    rows = sorted(run.table("findings").to_pylist(), key=lambda r: r["rank"])
    return rows, run.analysis.summary.get("counterfactual")


# Shapes whose logs no cache breaker can be searched in: no prompt text at all, or text that is not chat
# messages (the detector aligns messages). findings and check read it from a run, fix from each input file.
NO_TEXT = {"mooncake": "a hashed trace", "bailian": "a hashed trace", "tokens": "token ids"}
UNSEARCHED = frozenset({"completion"})


def uncheckable(run_dir: str | os.PathLike[str]) -> str | None:
    """Why no cache breaker can be detected in this run (None: it can). Breakers are searched for in chat
    messages: a hashed trace or token ids hold no text, and a completion prompt is one string with no
    message structure to align, so "none found" there would mean nothing (findings, check, fix)."""
    summary = (load_run(run_dir).manifest.get("analyze") or {}).get("summary") or {}
    inputs = summary.get("input") or {}
    if inputs.get("tokenizer") == "none":
        return "has no prompt text (a hashed trace or token ids)"
    shapes = set((inputs.get("shapes") or {}).values())
    if shapes and shapes <= UNSEARCHED:
        return "holds only completion prompts, which are not searched for cache breakers (chat messages are)"
    return None


def read_miss_attribution(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The summary's `miss_attribution` (the `misses` table's totals) of a run, None for older runs."""
    summary = (load_run(run_dir).manifest.get("analyze") or {}).get("summary") or {}
    return summary.get("miss_attribution")
