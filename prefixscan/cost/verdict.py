"""Is prefix-aware routing worth it here, and which open-source router to adopt: one rule, one computation.

The seeds' rule: worth it when repetition is proven (measured, not assumed), routing saves a real share
of the status quo's prefill GPUs (with few replicas round robin is often already warm), prefill is a
large share of GPU time, and the router does not create hot spots. `decide` evaluates each condition on
the very numbers the estimate prints (`VerdictInputs`), so a reason can never contradict the table; the
reasons listed are only those that support the headline. Adopt an open-source router before building one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MIN_REPLICAS = 8  # "more than ~8 replicas" (seed 000): below this analytic round robin is not trusted
MIN_PREFILL_SHARE = 0.3  # below this, prefill savings are a small slice of GPU time
MIN_IDEAL_HIT = 0.2  # token-weighted ideal-cache hit rate below which repetition is not there
MIN_SAVED_FRACTION = 0.1  # prefix-aware must save at least this share of the status quo's prefill GPUs
MIN_SAVED_GPUS = 1.0  # ... and at least one GPU: less is not worth running a router for
HOT_SPOT_IMBALANCE = 1.5  # busiest replica / mean load under the router
HOT_SPOT_TTFT = 1.25  # router TTFT p95 / round robin TTFT p95

# Open-source routers and the simulated policy each one implements (docs/engines.md, 'Routers').
ROUTERS = {
    "sglang": "SGLang router, policy cache_aware (sgl-router / model gateway)",
    "dynamo": "NVIDIA Dynamo KV router (kv-events mode, overlap_score_weight 1)",
    "llm-d": "llm-d inference scheduler (Gateway API Inference Extension, prefix-cache scorer)",
    "chwbl": "consistent hashing with bounded loads (Envoy / HAProxy hash-balance-factor 125%)",
    "preble": "a Preble-style E2 scheduler (no maintained open-source router; SGLang cache_aware is closest)",
}


@dataclass(frozen=True)
class Check:
    """One condition: "pass", "fail" or "unknown", the sentence, and the numbers the sentence cites."""

    name: str
    status: str
    text: str
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """Decision plus the reasons that support it, each a sentence a design review can quote."""

    worth_it: bool | None  # None: undecided because a condition could not be checked
    headline: str
    reasons: tuple[str, ...]
    router: str
    router_policy: str | None
    checks: tuple[Check, ...] = ()

    def to_json(self) -> dict:
        return {"worth_it": self.worth_it, "headline": self.headline, "reasons": list(self.reasons),
                "router": self.router, "router_policy": self.router_policy,
                "checks": [{"name": c.name, "status": c.status, "text": c.text, "numbers": c.numbers}
                           for c in self.checks]}


# Simulated policies that are baselines or bounds, not routers one could adopt (prefixscan.sim.policies).
NOT_ADOPTABLE = ("round_robin", "random", "least_loaded", "oracle")


def adoptable(policy: str) -> bool:
    """False for baselines (round robin, random, least loaded) and the oracle upper bound."""
    p = policy.lower().replace("-", "_")
    return not any(p == k or p.startswith(k) for k in NOT_ADOPTABLE)


def router_for_policy(policy: str | None) -> str:
    """The open-source router whose routing rule matches a simulated policy's name."""
    p = (policy or "").lower().replace("-", "_")
    return next((ROUTERS[router] for router, words in _ROUTER_WORDS if any(w in p for w in words)),
                ROUTERS["sglang"])  # sglang_cache_aware, radix-style policies, or no simulation


# Words in a policy's name that name its router, first match wins; cost_based is the seeds' overlap x w -
# load x v rule, which is Dynamo's cost shape.
_ROUTER_WORDS = (("dynamo", ("dynamo", "kv_router", "kv_aware", "overlap", "cost_based")),
                 ("llm-d", ("llm_d", "llmd", "precise", "scorer", "gie", "epp")),
                 ("chwbl", ("bounded", "chwbl", "consistent", "prefix_hash", "session_affinity")),
                 ("preble", ("preble",)))


@dataclass(frozen=True)
class VerdictInputs:
    """The numbers the estimate shows, exactly as shown: the verdict reads nothing else."""

    repetition_measured: bool
    ideal_hit_rate: float | None  # token-weighted, whole log (None: not measured)
    replicas: int
    basis: str  # "analytic", "replay" or "saved simulation": where round robin and the router come from
    rps: float
    status_quo: str  # "round robin" or "today (engine-reported)"
    status_quo_gpus: float
    status_quo_hit: float  # token-weighted
    router: str  # the policy or flag the prefix-aware scenario comes from
    router_gpus: float
    router_hit: float  # token-weighted
    round_robin_hit: float  # token-weighted
    prefill_share: float | None
    router_imbalance: float | None = None
    router_ttft_p95_s: float | None = None
    round_robin_ttft_p95_s: float | None = None
    best_policy: str | None = None
    # the rate is the busy-period rate of a gappy log (prefixscan.sim.rate): a sample's rate, not the
    # traffic's, so the absolute size of the saving is unchecked rather than failed
    rate_from_sample: bool = False


def _repetition(v: VerdictInputs) -> Check:
    h = v.ideal_hit_rate
    if h is not None and h < MIN_IDEAL_HIT:
        return Check("repetition", "fail", f"little repetition: an ideal cache would hit only {h:.0%} of prompt "
                     "tokens, so no router can save much", {"ideal_hit_rate": h})
    if v.repetition_measured and h is not None:
        return Check("repetition", "pass", f"repetition is measured: an ideal cache hits {h:.0%} of prompt "
                     "tokens", {"ideal_hit_rate": h})
    return Check("repetition", "unknown", "repetition is assumed (hit rate given on the command line), not "
                 "measured; run `prefixscan analyze` on real logs to prove it", {})


def gpus_text(x: float) -> str:
    """GPU counts as every printer shows them: one decimal from 10 up, two below."""
    return f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.2f}"


def _saving(v: VerdictInputs) -> Check:
    sq, saved = v.status_quo_gpus, v.status_quo_gpus - v.router_gpus
    frac = saved / sq if sq > 0 else 0.0
    nums = {"saved_gpus": saved, "status_quo_gpus": sq, "saved_fraction": frac, "router_hit": v.router_hit,
            "status_quo_hit": v.status_quo_hit, "replicas": v.replicas, "rps": v.rps}
    said = (f"{v.router} caches {v.router_hit:.1%} of prompt tokens against {v.status_quo_hit:.1%} for "
            f"{v.status_quo} on {v.replicas} replicas")
    if sq > 0 and frac >= MIN_SAVED_FRACTION and saved >= MIN_SAVED_GPUS:
        return Check("saving", "pass", f"{said}: it saves {gpus_text(saved)} of {gpus_text(sq)} prefill GPUs "
                     f"({frac:.0%})", nums)
    if sq > 0 and frac >= MIN_SAVED_FRACTION and v.rate_from_sample:
        return Check("saving", "unknown", f"{said}: it saves {frac:.0%} of prefill GPUs, {gpus_text(saved)} GPUs "
                     f"at the log's busy-period rate of {v.rps:,.4g} req/s; the log is a sample with idle gaps, "
                     "so whether that is enough to run a router for depends on the real traffic (price it "
                     "with --rps)", nums)
    if sq > 0 and frac >= MIN_SAVED_FRACTION:
        return Check("saving", "fail", f"{said}: it saves {frac:.0%} of prefill GPUs, but only "
                     f"{gpus_text(saved)} GPUs at {v.rps:,.4g} req/s, too little to run a router for (price "
                     "production traffic with --rps)", nums)
    warm = ""
    if v.basis != "analytic" and v.router_hit > 0 and v.round_robin_hit >= 0.8 * v.router_hit:
        warm = (f"; round robin already caches {v.round_robin_hit:.1%} because shared prefixes end up warm "
                "on every replica")
    return Check("saving", "fail", f"{said}{warm}: it saves only {gpus_text(saved)} of {gpus_text(sq)} "
                 f"prefill GPUs ({frac:.0%})", nums)


def _replicas(v: VerdictInputs) -> Check | None:
    if v.basis != "analytic":
        return None  # replayed: the replica count acts through the round-robin hit rate above
    n = v.replicas
    if n <= MIN_REPLICAS:
        return Check("replicas", "unknown", f"round robin is modelled analytically as a 1/{n} hit chance; with "
                     f"only {n} replicas a shared prefix is often warm on every replica, so replay a log "
                     "(`prefixscan estimate RUN_DIR`) to measure it", {"replicas": n})
    return Check("replicas", "pass", f"{n} replicas: round robin finds the warm replica only ~1/{n} of the "
                 "time (analytic)", {"replicas": n})


def _prefill_share(v: VerdictInputs) -> Check:
    s = v.prefill_share
    if s is None:
        return Check("prefill_share", "unknown", "prefill share of GPU time unknown (pass --output-tokens to "
                     "estimate decode time)", {})
    if s < MIN_PREFILL_SHARE:
        return Check("prefill_share", "fail", f"prefill is only {s:.0%} of GPU time under {v.status_quo}; "
                     "decode dominates, so saved prefill is a small share of the bill", {"prefill_share": s})
    return Check("prefill_share", "pass", f"prefill is {s:.0%} of GPU time under {v.status_quo}",
                 {"prefill_share": s})


def _hot_spots(v: VerdictInputs) -> Check | None:
    imb, a, b = v.router_imbalance, v.router_ttft_p95_s, v.round_robin_ttft_p95_s
    if imb is None or a is None or not b:
        return None
    nums = {"router_imbalance": imb, "router_ttft_p95_s": a, "round_robin_ttft_p95_s": b}
    if imb > HOT_SPOT_IMBALANCE and a > HOT_SPOT_TTFT * b:
        return Check("hot_spots", "fail", f"hot spots: under {v.router} the busiest replica carries {imb:.2f}x "
                     f"the mean load and TTFT p95 rises to {a:.3f} s from {b:.3f} s under round robin", nums)
    return Check("hot_spots", "pass", f"no hot spots: under {v.router} the busiest replica carries {imb:.2f}x "
                 f"the mean load, TTFT p95 {a:.3f} s against {b:.3f} s under round robin", nums)


def decide(v: VerdictInputs) -> Verdict:
    """Evaluate every condition on `v`; the headline follows from them and lists only agreeing reasons."""
    checks = tuple(c for c in (_repetition(v), _saving(v), _replicas(v), _prefill_share(v), _hot_spots(v))
                   if c is not None)
    failed = [c.text for c in checks if c.status == "fail"]
    unknown = [c.text for c in checks if c.status == "unknown"]
    passed = [c.text for c in checks if c.status == "pass"]
    router = router_for_policy(v.best_policy)
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return Verdict(False, f"Not worth it: {failed[0]}{more}.", tuple(failed), router, v.best_policy, checks)
    adopt = f"Adopt {router} rather than building a router."
    if unknown:
        headline = f"Likely worth it if the {len(unknown)} unchecked condition(s) below hold. {adopt}"
        return Verdict(None, headline, tuple(passed + unknown), router, v.best_policy, checks)
    return Verdict(True, f"Worth it. {adopt}", tuple(passed), router, v.best_policy, checks)
