"""Workload numbers the estimate needs, measured from a run directory instead of typed in.

Reads `requests` (rate, context, new tokens, ideal-cache hit rate) and, when the later stages have run,
`capacity_curve` (LRU hit rate vs KV capacity) and `sim_policies` (one row per simulated policy).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from prefixscan.errors import InputError


@dataclass(frozen=True)
class PolicyHit:
    """One simulated routing policy: its token-weighted cluster hit rate and simulated TTFT."""

    policy: str
    hit_rate_token_weighted: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None


@dataclass(frozen=True)
class MeasuredWorkload:
    """Averages over the requests table; hit rates are token-weighted (REFERENCE.md 9)."""

    requests: int
    span_s: float
    rps: float
    context_tokens: float
    new_tokens: float
    output_tokens: float | None
    ideal_hit_rate_token_weighted: float
    capacity_curve: tuple[tuple[float, float], ...] | None  # (capacity_tokens, lru_hit_rate), sorted
    policies: tuple[PolicyHit, ...]
    replicas: int | None  # from the manifest's simulate section, when present

    def lru_hit_rate_at(self, capacity_tokens: float) -> float | None:
        """LRU token-weighted hit rate at a cache capacity, linearly interpolated (clamped at the ends)."""
        if not self.capacity_curve:
            return None
        pts = self.capacity_curve
        if capacity_tokens <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            if capacity_tokens <= x1:
                return y0 + (y1 - y0) * (capacity_tokens - x0) / (x1 - x0) if x1 > x0 else y1
        return pts[-1][1]


def _col(table, name: str) -> list:  # noqa: ANN001 - pyarrow table
    if name not in table.column_names:
        raise InputError(f"requests table lacks column {name!r} (has {', '.join(table.column_names)})")
    return table.column(name)


def measure_run(path: str | os.PathLike[str]) -> MeasuredWorkload:
    """Measure rate, mean context, mean new tokens and hit rates from a run directory."""
    import pyarrow.compute as pc

    from prefixscan.io.rundir import load_run

    run = load_run(path)
    req = run.table("requests")
    n = req.num_rows
    if n == 0:
        raise InputError(f"run {path} has an empty requests table; nothing to estimate")
    arrival = _col(req, "arrival_s")
    prompt = pc.cast(_col(req, "prompt_tokens"), "float64")
    cached = pc.cast(_col(req, "cached_tokens"), "float64")
    span = float(pc.max(arrival).as_py() - pc.min(arrival).as_py())
    # rows / span (the team's definition; differs from (n-1)/span by 1/n, negligible on real logs).
    rps = n / span if span > 0 else math.nan
    sum_prompt = float(pc.sum(prompt).as_py() or 0.0)
    sum_cached = float(pc.sum(cached).as_py() or 0.0)
    output = None
    if "output_tokens" in req.column_names:
        out = req.column("output_tokens")
        if out.null_count < n:
            output = float(pc.mean(pc.cast(out, "float64")).as_py())
    curve = None
    if run.has("capacity_curve"):
        cc = run.table("capacity_curve")
        caps = cc.column("capacity_tokens").to_pylist()
        lru = cc.column("lru_hit_rate").to_pylist()
        curve = tuple(sorted((float(c), float(h)) for c, h in zip(caps, lru, strict=True)
                             if c is not None and h is not None)) or None
    policies: list[PolicyHit] = []
    if run.has("sim_policies"):
        sp = run.table("sim_policies").to_pylist()
        for row in sp:
            if row.get("hit_rate_token_weighted") is None:  # a policy that served no prompt tokens
                continue
            policies.append(PolicyHit(str(row["policy"]), float(row["hit_rate_token_weighted"]),
                                      _opt(row.get("ttft_p50_s")), _opt(row.get("ttft_p95_s"))))
    sim = run.manifest.get("simulate") or {}
    # `prefixscan simulate` records its config under manifest["simulate"]["config"].
    cfg = sim.get("config") if isinstance(sim, dict) else None
    replicas = (sim.get("replicas") if isinstance(sim, dict) else None) or (
        cfg.get("replicas") if isinstance(cfg, dict) else None)
    return MeasuredWorkload(
        requests=n, span_s=span, rps=rps, context_tokens=sum_prompt / n,
        new_tokens=(sum_prompt - sum_cached) / n,
        output_tokens=output,
        ideal_hit_rate_token_weighted=sum_cached / sum_prompt if sum_prompt > 0 else 0.0,
        capacity_curve=curve, policies=tuple(policies),
        replicas=int(replicas) if isinstance(replicas, int | float) else None,
    )


def _opt(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]
