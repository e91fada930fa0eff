"""Pilot against control: the pilot measurement of two runs, or of two pools of one run, side by side
(requests, hit rate, prefill tokens, TTFT and queue wait p50 / p95 for all, warm, partial and cold
requests, with B - A).

A side is a run directory, optionally narrowed to the requests whose replica matches a name or a glob
(`diff RUN RUN --pool-a 'ctl-*' --pool-b 'pilot-*'`). Each side is measured by the one pilot rule
(prefixscan.pilot.latency.of_frame) over the run's requests table, never from a copy of its numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import polars as pl

from prefixscan.errors import InputError, UsageError
from prefixscan.pilot.latency import CLASSES, COLUMNS, LATENCY, has_latency, of_frame
from prefixscan.run.load import load_run

GROUPS = ("all", *CLASSES)
METRICS = ("ttft", "queue_wait")
LATENCY_KEYS = tuple(f"{m}_p{p}_s" for m in METRICS for p in (50, 95))


@dataclass(frozen=True)
class PilotSide:
    """One side's pilot rows by group (`all`, `warm`, `partial`, `cold`; prefixscan.pilot.latency's row keys)."""

    run: str
    pool: str | None
    cached_source: str
    rows: dict[str, dict[str, Any]]
    has_latency: bool

    @property
    def label(self) -> str:
        return self.run + (f" (pool {self.pool})" if self.pool is not None else "")

    def hit_rate(self, group: str = "all") -> float | None:
        r = self.rows[group]
        return r["cached_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else None

    def share(self, group: str) -> float | None:
        n = self.rows["all"]["requests"]
        return self.rows[group]["requests"] / n if n else None


@dataclass(frozen=True)
class PilotComparison:
    """Both sides; `warnings` say where they are measured differently."""

    a: PilotSide
    b: PilotSide
    warnings: tuple[str, ...]


def pilot_side(run_dir: str | os.PathLike[str], pool: str | None = None) -> PilotSide:
    """The pilot measurement of a run (its requests on replica `pool` only, when given)."""
    run = load_run(run_dir)
    df = pl.read_parquet(run.checked_file("requests"), columns=COLUMNS)
    if pool is not None:
        pools = sorted(df["replica"].drop_nulls().unique().to_list())
        mine = [p for p in pools if fnmatchcase(p, pool)]  # a name, or a glob over replicas (`gpu-pilot-*`)
        if not mine:
            raise UsageError(f"run {run_dir} has no request on replica or pool {pool!r} (it has: "
                             f"{', '.join(map(repr, pools[:12])) or 'no replica field'}"
                             f"{', ...' if len(pools) > 12 else ''})")
        df = df.filter(pl.col("replica").is_in(mine))
    block = int((run.manifest.get("config") or {}).get("block_size") or 16)
    table, summary = of_frame(df, block)
    rows = {r["class"] or "all": r for r in table.to_pylist() if r["level"] in ("all", "class")}
    latency = any(df[c].null_count() < df.height for c in LATENCY) if df.height else False
    return PilotSide(str(run_dir), pool, summary["cached_source"], rows, latency)


def compare_pilot(run_a: str | os.PathLike[str], run_b: str | os.PathLike[str], pool_a: str | None = None,
                  pool_b: str | None = None, required: bool = False) -> PilotComparison | None:
    """Both sides, or None when neither carries latency and none was asked for. `required` (a pool given, or
    `diff --pilot`): a side without latency, or sides classed on different bases, is an input error."""
    required = required or pool_a is not None or pool_b is not None
    if not required and not any(has_latency(load_run(r).checked_file("requests")) for r in (run_a, run_b)):
        return None  # read from the footers: a diff of runs without latency reads no requests column
    a, b = pilot_side(run_a, pool_a), pilot_side(run_b, pool_b)
    warnings = []
    for side, name in ((a, "A"), (b, "B")):
        if not side.has_latency:
            msg = (f"{name} = {side.label} carries no latency (no ttft, e2e or queue wait on any request): "
                   "analyze a log with TTFT fields to compare pilot and control (docs/pilot.md)")
            if required:
                raise InputError(msg)
            warnings.append(msg)
    if a.cached_source != b.cached_source:
        msg = (f"A is classed by {a.cached_source} cached tokens and B by {b.cached_source}: warm, partial and "
               "cold mean different things; log the engine's cached tokens in both (docs/pilot.md)")
        if required:
            raise InputError(msg)
        warnings.append(msg)
    return PilotComparison(a, b, tuple(warnings))


def pilot_json(c: PilotComparison) -> dict[str, Any]:
    """The comparison as plain data: per group, A, B and B - A of each measure."""
    out: dict[str, Any] = {"a": {"run": c.a.run, "pool": c.a.pool, "cached_source": c.a.cached_source},
                           "b": {"run": c.b.run, "pool": c.b.pool, "cached_source": c.b.cached_source},
                           "warnings": list(c.warnings), "groups": {}}
    for g in GROUPS:
        ra, rb = c.a.rows[g], c.b.rows[g]
        row: dict[str, Any] = {}
        pairs = [("requests", ra["requests"], rb["requests"]), ("share", c.a.share(g), c.b.share(g)),
                 ("hit_rate", c.a.hit_rate(g), c.b.hit_rate(g)),
                 ("uncached_tokens", ra["uncached_tokens"], rb["uncached_tokens"])]
        pairs += [(k, ra[k], rb[k]) for k in LATENCY_KEYS]
        for key, va, vb in pairs:
            row[key] = {"a": va, "b": vb, "delta": None if va is None or vb is None else vb - va}
        out["groups"][g] = row
    return out
