"""The results of `estimate`: plain frozen dataclasses the reporters render and `to_json` serialises."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from prefixscan.cost.scenario import ScenarioSpec
from prefixscan.cost.status_quo import StatusQuo
from prefixscan.cost.verdict import Verdict


@dataclass(frozen=True)
class Workload:
    """The traffic being costed: rate, mean context, mean uncachable (new) tokens, mean output."""

    rps: float
    context_tokens: float
    new_tokens: float
    output_tokens: float | None
    source: str  # "flags" or the run directory
    measured_rps: float | None = None
    requests: int | None = None
    ideal_hit_rate_token_weighted: float | None = None

    @property
    def reusable_fraction(self) -> float:
        """Share of a prompt a hit reuses: (context - new) / context."""
        return (self.context_tokens - self.new_tokens) / self.context_tokens


@dataclass(frozen=True)
class Scenario:
    """Prefill load and GPUs under one routing assumption.

    `hit_rate` is the share of requests with any prompt token cached (None where nothing says it);
    `hit_rate_token_weighted` is cached / prompt tokens; `capture_of_ideal` is the share of the ideal
    cache's hits, the `h` of the seed's formula (on a run, each hit is assumed to reuse what an ideal
    cache would). `basis` says where the numbers come from: flags, analytic, replay, saved simulation,
    engine-reported, measured.
    """

    name: str
    hit_rate: float | None
    hit_rate_token_weighted: float
    capture_of_ideal: float
    prefill_tokens_s: float
    prefill_flops_s: float
    gpus: float
    usd_per_month: float
    source: str = ""
    basis: str = ""
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None


@dataclass(frozen=True)
class SensitivityRow:
    parameter: str  # capture_of_ideal | mfu | usd_per_gpu_hour
    value: float
    gpus_prefix_aware: float
    monthly_savings_usd: float


@dataclass(frozen=True)
class EstimateResult:
    """Result of `estimate`; reporters render it, `to_json` is the stable machine form."""

    spec: ScenarioSpec
    linear: bool
    hours_per_month: float
    workload: Workload
    per_gpu_prefill_tokens_s: float
    baseline_basis: str  # "analytic", "replay" or "saved simulation"
    baseline_detail: str
    scenarios: tuple[Scenario, ...]  # no_reuse, [today], round_robin, prefix_aware, ideal
    status_quo: str  # name of the scenario savings are measured against: "today" or "round_robin"
    policies: tuple[Scenario, ...]  # one per replayed policy
    policy_rows: tuple[dict[str, Any], ...]  # the simulator's summary row of each replayed policy
    engine: StatusQuo | None
    monthly_gpu_hours_saved: float
    monthly_savings_usd: float  # against the status quo
    monthly_savings_vs_round_robin_usd: float
    monthly_savings_vs_no_reuse_usd: float
    ttft_hit_s: float
    ttft_miss_s: float
    ttft_idle_hit_s: float
    ttft_idle_miss_s: float
    kv_bytes_per_token: float
    prefill_share: float | None
    sensitivity: tuple[SensitivityRow, ...]
    verdict: Verdict
    notes: tuple[str, ...]

    def scenario(self, name: str) -> Scenario:
        return next(s for s in self.scenarios if s.name == name)

    def to_json(self) -> dict[str, Any]:
        """Plain dict for `--json`; the keys gpus, monthly_savings_usd and ttft_s are a stable contract."""
        asdict, spec = dataclasses.asdict, self.spec
        return {
            "scenario": self.spec.to_json(),
            "baselines": {"basis": self.baseline_basis, "detail": self.baseline_detail},
            "gpus": {s.name: s.gpus for s in self.scenarios},
            "status_quo": self.status_quo,
            "monthly_savings_usd": self.monthly_savings_usd,
            "monthly_savings_vs_round_robin_usd": self.monthly_savings_vs_round_robin_usd,
            "monthly_savings_vs_no_reuse_usd": self.monthly_savings_vs_no_reuse_usd,
            "monthly_gpu_hours_saved": self.monthly_gpu_hours_saved,
            "ttft_s": {"hit": self.ttft_hit_s, "miss": self.ttft_miss_s},
            "ttft_idle_s": {"hit": self.ttft_idle_hit_s, "miss": self.ttft_idle_miss_s},
            "scenarios": [asdict(s) for s in self.scenarios],
            "policies": [asdict(s) for s in self.policies],
            "policy_rows": [dict(r) for r in self.policy_rows],
            "engine_reported": asdict(self.engine) if self.engine else None,
            "workload": asdict(self.workload),
            "model": asdict(spec.model),
            "gpu": asdict(spec.gpu),
            "assumptions": {
                "dtype": spec.dtype, "kv_dtype": spec.kv_dtype, "mfu": spec.mfu, "linear": self.linear,
                "replicas": spec.replicas, "tensor_parallel": spec.tensor_parallel,
                "usd_per_gpu_hour": spec.gpu.usd_per_hour, "hours_per_month": self.hours_per_month,
                "per_gpu_prefill_tokens_s": self.per_gpu_prefill_tokens_s,
            },
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_capacity_tokens_per_replica": spec.kv_tokens_per_replica,
            "prefill_share": self.prefill_share,
            "sensitivity": [asdict(r) for r in self.sensitivity],
            "verdict": self.verdict.to_json(),
            "notes": list(self.notes),
        }
