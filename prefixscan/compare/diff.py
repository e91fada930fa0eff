"""`prefixscan diff RUN_A RUN_B`: what changed between two runs, e.g. before and after a template change.

Hit rates under every definition, per tenant and prefix class, the breakers fixed, new and remaining,
and prefill tokens (with a model and GPU, prefill GPUs at a request rate). Deltas are B minus A.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefixscan.compare.facts import DEFINITIONS, GROUPS, Breaker, RunFacts, load_facts
from prefixscan.compare.pilot import PilotComparison, compare_pilot
from prefixscan.run.load import load_run


@dataclass(frozen=True)
class GroupDelta:
    """One key of a dimension (a tenant, a prefix class) in both runs; None where a run lacks it."""

    dimension: str
    key: str
    requests_a: int | None
    requests_b: int | None
    rate_a: float | None
    rate_b: float | None

    @property
    def delta(self) -> float | None:
        return None if self.rate_a is None or self.rate_b is None else self.rate_b - self.rate_a


@dataclass(frozen=True)
class BreakerChange:
    """A breaker matched across runs by kind, tenant, label and message: fixed, new or remaining."""

    status: str  # "fixed" | "new" | "remaining"
    breaker: Breaker
    tokens_lost_a: int
    tokens_lost_b: int


@dataclass(frozen=True)
class Prefill:
    """Ideal-cache prefill of one run: tokens computed per request, and GPUs at a scenario if asked."""

    requests: int
    prompt_tokens: int
    computed_tokens: int
    gpus: float | None

    @property
    def computed_per_request(self) -> float:
        return self.computed_tokens / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class DiffResult:
    """Everything `diff` shows; renderers in prefixscan.report turn it into text, JSON or Markdown."""

    a: RunFacts
    b: RunFacts
    rates: tuple[tuple[str, float | None, float | None], ...]
    groups: tuple[GroupDelta, ...]
    breakers: tuple[BreakerChange, ...] | None
    prefill_a: Prefill
    prefill_b: Prefill
    scenario: str | None
    warnings: tuple[str, ...]
    pilot: PilotComparison | None = None  # both runs' pilot measurement (prefixscan.compare.pilot)


def _rates(a: RunFacts, b: RunFacts) -> tuple[tuple[str, float | None, float | None], ...]:
    names = [k for k in DEFINITIONS if k in a.hit_rates or k in b.hit_rates]
    return tuple((k, a.hit_rates.get(k), b.hit_rates.get(k)) for k in names)


def _groups(a: RunFacts, b: RunFacts) -> tuple[GroupDelta, ...]:
    out = []
    for dim in GROUPS:
        ga, gb = a.groups.get(dim, {}), b.groups.get(dim, {})
        for key in sorted(set(ga) | set(gb)):
            ra, rb = ga.get(key), gb.get(key)
            out.append(GroupDelta(dim, key, int(ra["requests"]) if ra else None, int(rb["requests"]) if rb else None,
                                  ra["token_weighted"] if ra else None, rb["token_weighted"] if rb else None))
    return tuple(out)


def _breakers(a: RunFacts, b: RunFacts) -> tuple[BreakerChange, ...] | None:
    if a.breakers is None or b.breakers is None:
        return None
    in_a = {x.key: x for x in a.breakers}
    in_b = {x.key: x for x in b.breakers}
    out = [BreakerChange("remaining" if k in in_b else "fixed", x, x.tokens_lost, in_b[k].tokens_lost if k in in_b
                         else 0) for k, x in in_a.items()]
    out += [BreakerChange("new", x, 0, x.tokens_lost) for k, x in in_b.items() if k not in in_a]
    order = {"new": 0, "remaining": 1, "fixed": 2}
    return tuple(sorted(out, key=lambda c: (order[c.status], -max(c.tokens_lost_a, c.tokens_lost_b))))


def _prefill(run_dir: str | os.PathLike[str], f: RunFacts, scenario: dict[str, Any] | None) -> Prefill:
    computed = f.prompt_tokens - f.cached_tokens
    if scenario is None:
        return Prefill(f.requests, f.prompt_tokens, computed, None)
    from prefixscan.hardware.flops import effective_flops, prefill_flops

    t = load_run(run_dir).table("requests").select(["prompt_tokens", "cached_tokens"])
    n = t.column("prompt_tokens").to_numpy(zero_copy_only=False).astype(np.int64)
    c = t.column("cached_tokens").to_numpy(zero_copy_only=False).astype(np.int64)
    pairs, counts = np.unique(np.stack([n - c, c], axis=1), axis=0, return_counts=True) if len(n) else (
        np.zeros((0, 2), np.int64), np.zeros(0, np.int64))
    flops = sum(int(k) * prefill_flops(int(new), int(cached), scenario["model"], scenario["linear"])
                for (new, cached), k in zip(pairs.tolist(), counts.tolist(), strict=True))
    per_request_s = flops / max(f.requests, 1) / effective_flops(scenario["gpu"], scenario["dtype"], scenario["mfu"])
    return Prefill(f.requests, f.prompt_tokens, computed, scenario["rps"] * per_request_s)


def _warnings(a: RunFacts, b: RunFacts) -> tuple[str, ...]:
    w = []
    if a.block_size != b.block_size:
        w.append(f"block sizes differ ({a.block_size} vs {b.block_size}): hit rates are not directly comparable")
    if a.tokenizer != b.tokenizer:
        w.append(f"tokenizers differ ({a.tokenizer} vs {b.tokenizer}): token counts are not directly comparable")
    return tuple(w)


def diff_runs(run_a: str | os.PathLike[str], run_b: str | os.PathLike[str], model: str | None = None,
              gpu: str = "h100", rps: float | None = None, dtype: str = "bf16", mfu: float = 0.5,
              linear: bool = False, pool_a: str | None = None, pool_b: str | None = None,
              pilot: bool = False) -> DiffResult:
    """Compare run B with run A; with `model` and `rps`, also ideal-cache prefill GPUs of each at that rate.
    The pilot measurement of both (one pool of each with `pool_a` / `pool_b`) when either carries latency;
    `pilot` (or a pool) requires it of both (prefixscan.compare.pilot)."""
    a, b = load_facts(run_a), load_facts(run_b)
    scenario: dict[str, Any] | None = None
    label = None
    if model is not None or rps is not None:
        from prefixscan.errors import UsageError
        from prefixscan.hardware.gpus import get_gpu
        from prefixscan.hardware.models import get_model

        if model is None or rps is None or rps <= 0:
            raise UsageError("prefill GPUs need both --model and --rps (> 0)")
        scenario = {"model": get_model(model), "gpu": get_gpu(gpu), "rps": rps, "dtype": dtype, "mfu": mfu,
                    "linear": linear}
        label = f"{scenario['model'].name} {dtype} on {scenario['gpu'].name} at {rps:g} req/s, MFU {mfu:g}" + (
            ", linear FLOPs" if linear else "")
    pilots = compare_pilot(run_a, run_b, pool_a, pool_b, required=pilot)
    return DiffResult(a, b, _rates(a, b), _groups(a, b), _breakers(a, b), _prefill(run_a, a, scenario),
                      _prefill(run_b, b, scenario), label, _warnings(a, b), pilots)
