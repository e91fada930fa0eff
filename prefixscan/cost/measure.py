"""Workload numbers the estimate needs, measured from a run directory instead of typed in.

Reads `requests` (rate, context, new tokens, ideal-cache hit rate, and the engine's own cached-token
counts when the log carried them) and the manifest's `simulate` section (the saved simulation's
scenario). Hit rates are token-weighted (docs/definitions.md, 'Hit rates').
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from prefixscan.errors import InputError


@dataclass(frozen=True)
class EngineReported:
    """What the serving engine said it cached, over the requests whose log line carries the number."""

    requests: int  # rows with `actual_cached_tokens`
    prompt_tokens: int  # prompt tokens of those rows
    cached_tokens: int  # engine-reported cached tokens of those rows
    ideal_cached_tokens: int  # what an ideal cache (this tokenizer, this block size) hits on those rows
    hit_requests: int | None  # rows whose engine-reported cached tokens are > 0 (None: counters only)
    above_ideal_requests: int  # rows where the engine cached more than an ideal cache could
    source: str = "log"  # "log": per-request counts in the log; "counters": the engine's metrics (evidence)
    detail: str = ""  # for counters: which engine, whether the scrapes cover the log's window

    @property
    def hit_rate_token_weighted(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def ideal_hit_rate_token_weighted(self) -> float:
        return self.ideal_cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class MeasuredWorkload:
    """Averages over the requests table plus the saved simulation's settings."""

    requests: int
    span_s: float
    rps: float  # the log's rate: the busy-period rate on a gappy log (prefixscan.sim.rate), else n / span
    context_tokens: float
    new_tokens: float
    output_tokens: float | None
    ideal_hit_rate_token_weighted: float
    ideal_hit_requests: int  # requests an ideal cache hits at all (cached_tokens > 0)
    engine: EngineReported | None
    block_size: int
    replayable: str | None  # None when the simulator can replay the table, else why not
    sim_config: dict[str, Any] | None  # manifest["simulate"]["config"], when a simulation was saved
    sim_workload: dict[str, Any] | None  # manifest["simulate"]["workload"]
    mean_rps: float = math.nan  # requests / span, gaps included
    busy_s: float | None = None  # span minus idle gaps, when the log is gappy
    rate_note: str | None = None  # why `rps` is not the mean rate (a gappy log), for every printer

    @property
    def gappy(self) -> bool:
        return self.busy_s is not None

    @property
    def replicas(self) -> int | None:
        r = (self.sim_config or {}).get("replicas")
        return int(r) if isinstance(r, int | float) else None


def _col(table, name: str) -> Any:  # pyarrow table
    if name not in table.column_names:
        raise InputError(f"requests table lacks column {name!r} (has {', '.join(table.column_names)})")
    return table.column(name)


def engine_reported(req: Any) -> EngineReported | None:
    """Engine-reported cached tokens (`actual_cached_tokens`), when any row has them."""
    import pyarrow.compute as pc

    if "actual_cached_tokens" not in req.column_names:
        return None
    rows = req.filter(pc.is_valid(req.column("actual_cached_tokens")))
    if rows.num_rows == 0:
        return None
    actual = pc.cast(rows.column("actual_cached_tokens"), "int64")
    ideal = pc.cast(rows.column("cached_tokens"), "int64")

    def total(a: Any) -> int:
        return int(pc.sum(a).as_py() or 0)

    return EngineReported(
        requests=rows.num_rows, prompt_tokens=total(pc.cast(rows.column("prompt_tokens"), "int64")),
        cached_tokens=total(actual), ideal_cached_tokens=total(ideal),
        hit_requests=total(pc.cast(pc.greater(actual, 0), "int64")),
        above_ideal_requests=total(pc.cast(pc.greater(actual, ideal), "int64")),
    )


def _counters(manifest: dict[str, Any], requests: int) -> EngineReported | None:
    """The engine's prefix-cache counters attached by `analyze --metrics` (manifest["evidence"]["metrics"])."""
    ev = ((manifest.get("evidence") or {}).get("metrics") or {}) if isinstance(manifest.get("evidence"), dict) \
        else {}
    queries, hits = ev.get("queries"), ev.get("hits")
    if not queries or hits is None:
        return None
    window = "the same window as the log" if ev.get("same_window") else (
        f"{float(ev.get('coverage') or 0):.0%} of the log's prompt tokens: another window, compare rates only")
    ideal = float(ev.get("predicted_ideal_hit_rate") or 0.0)
    return EngineReported(requests=requests, prompt_tokens=int(queries), cached_tokens=int(hits),
                          ideal_cached_tokens=int(round(ideal * queries)), hit_requests=None,
                          above_ideal_requests=0, source="counters",
                          detail=f"{ev.get('engine') or 'engine'} prefix-cache counters covering {window}")


def measure_run(path: str | os.PathLike[str]) -> MeasuredWorkload:
    """Measure rate, mean context, mean new tokens and hit rates from a run directory."""
    import pyarrow.compute as pc

    from prefixscan.run.load import load_run

    run = load_run(path)
    req = run.table("requests")
    n = req.num_rows
    if n == 0:
        raise InputError(f"run {path} has an empty requests table; nothing to estimate")
    arrival = _col(req, "arrival_s")
    prompt = pc.cast(_col(req, "prompt_tokens"), "float64")
    cached = pc.cast(_col(req, "cached_tokens"), "float64")
    from prefixscan.sim.rate import activity

    act = activity(arrival.to_numpy())
    span = act.span_s
    # rows / (busy) span (the team's definition; differs from (n-1)/span by 1/n, negligible on real logs).
    rps = act.rps
    sum_prompt = float(pc.sum(prompt).as_py() or 0.0)
    sum_cached = float(pc.sum(cached).as_py() or 0.0)
    output = None
    if "output_tokens" in req.column_names:
        out = req.column("output_tokens")
        if out.null_count < n:
            output = float(pc.mean(pc.cast(out, "float64")).as_py())
    from prefixscan.schema import REPLAY_COLUMNS

    lacking = [c for c in REPLAY_COLUMNS if c not in req.column_names]
    return MeasuredWorkload(
        requests=n, span_s=span, rps=rps, context_tokens=sum_prompt / n,
        new_tokens=(sum_prompt - sum_cached) / n,
        output_tokens=output,
        ideal_hit_rate_token_weighted=sum_cached / sum_prompt if sum_prompt > 0 else 0.0,
        ideal_hit_requests=int(pc.sum(pc.cast(pc.greater(cached, 0), "int64")).as_py() or 0),
        engine=engine_reported(req) or _counters(run.manifest, n),
        block_size=int((run.manifest.get("config") or {}).get("block_size") or 16),
        replayable=(f"the requests table lacks {', '.join(lacking)}" if lacking else None),
        sim_config=run.sim.config if run.sim is not None else None,
        sim_workload=run.sim.workload if run.sim is not None else None,
        mean_rps=act.mean_rps, busy_s=act.busy_s if act.gappy else None, rate_note=act.note(),
    )
