"""Is prefix-aware routing worth it here, and which open-source router to adopt.

The seeds' rule: worth it when repetition is proven (measured, not assumed), there are more than about
8 replicas (with few replicas round robin already lands on the warm replica often), and prefill is a
large share of GPU time (otherwise saved prefill is a small share of the bill). Adopt an open-source
router before building one.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_REPLICAS = 8  # "more than ~8 replicas" (seed 000)
MIN_PREFILL_SHARE = 0.3  # below this, prefill savings are a small slice of GPU time
MIN_IDEAL_HIT = 0.2  # token-weighted ideal-cache hit rate below which repetition is not there
MIN_SAVED_FRACTION = 0.1  # prefix-aware must save at least this share of round-robin prefill GPUs

# Open-source routers and the simulated policy each one implements (REFERENCE.md 2-5).
ROUTERS = {
    "sglang": "SGLang router, policy cache_aware (sgl-router / model gateway)",
    "dynamo": "NVIDIA Dynamo KV router (kv-events mode, overlap_score_weight 1)",
    "llm-d": "llm-d inference scheduler (Gateway API Inference Extension, prefix-cache scorer)",
    "chwbl": "consistent hashing with bounded loads (Envoy / HAProxy hash-balance-factor 125%)",
    "preble": "a Preble-style E2 scheduler (no maintained open-source router; SGLang cache_aware is closest)",
}


@dataclass(frozen=True)
class Verdict:
    """Decision plus the reasons, each a sentence a design review can quote."""

    worth_it: bool | None  # None: undecided because a criterion could not be checked
    headline: str
    reasons: tuple[str, ...]
    router: str
    router_policy: str | None

    def to_json(self) -> dict:
        return {"worth_it": self.worth_it, "headline": self.headline, "reasons": list(self.reasons),
                "router": self.router, "router_policy": self.router_policy}


# Simulated policies that are baselines or bounds, not routers one could adopt (prefixscan.sim.policies).
NOT_ADOPTABLE = ("round_robin", "random", "least_loaded", "oracle")


def adoptable(policy: str) -> bool:
    """False for baselines (round robin, random, least loaded) and the oracle upper bound."""
    p = policy.lower().replace("-", "_")
    return not any(p == k or p.startswith(k) for k in NOT_ADOPTABLE)


def router_for_policy(policy: str | None) -> str:
    """The open-source router whose routing rule matches a simulated policy's name."""
    p = (policy or "").lower().replace("-", "_")
    # cost_based is the seeds' overlap x w - load x v rule, which is Dynamo's cost shape.
    if any(k in p for k in ("dynamo", "kv_router", "kv_aware", "overlap", "cost_based")):
        return ROUTERS["dynamo"]
    if any(k in p for k in ("llm_d", "llmd", "precise", "scorer", "gie", "epp")):
        return ROUTERS["llm-d"]
    if any(k in p for k in ("bounded", "chwbl", "consistent", "prefix_hash", "session_affinity")):
        return ROUTERS["chwbl"]
    if "preble" in p:
        return ROUTERS["preble"]
    return ROUTERS["sglang"]  # sglang_cache_aware, radix-style policies, or no simulation


def decide(*, repetition_measured: bool, ideal_hit_rate: float | None, replicas: int,
           prefill_share: float | None, gpus_round_robin: float, gpus_prefix_aware: float,
           best_policy: str | None) -> Verdict:
    """Apply the seeds' three conditions plus a minimum saving; say which failed or is unchecked."""
    failed: list[str] = []
    passed: list[str] = []
    unknown: list[str] = []
    if ideal_hit_rate is not None and ideal_hit_rate < MIN_IDEAL_HIT:
        failed.append(f"little repetition: an ideal cache would hit only {ideal_hit_rate:.0%} of prompt "
                      "tokens, so no router can save much")
    elif repetition_measured:
        passed.append(f"repetition is measured: an ideal cache hits {ideal_hit_rate:.0%} of prompt tokens")
    else:
        unknown.append("repetition is assumed (hit rate given on the command line), not measured; run "
                       "`prefixscan analyze` on real logs to prove it")
    if replicas <= MIN_REPLICAS:
        failed.append(f"only {replicas} replicas: round robin already lands on the warm replica about "
                      f"1 time in {replicas}, and routing by prefix risks hot spots for little gain")
    else:
        passed.append(f"{replicas} replicas: round robin finds the warm replica only ~1/{replicas} "
                      "of the time")
    if prefill_share is None:
        unknown.append("prefill share of GPU time unknown (pass --output-tokens to estimate decode time)")
    elif prefill_share < MIN_PREFILL_SHARE:
        failed.append(f"prefill is only {prefill_share:.0%} of GPU time under round robin; decode dominates, "
                      "so saved prefill is a small share of the bill")
    else:
        passed.append(f"prefill is {prefill_share:.0%} of GPU time under round robin")
    saved = gpus_round_robin - gpus_prefix_aware
    if gpus_round_robin <= 0 or saved < max(1.0, MIN_SAVED_FRACTION * gpus_round_robin):
        failed.append(f"prefix-aware routing saves only {saved:.1f} prefill GPUs of {gpus_round_robin:.1f}")
    else:
        passed.append(f"prefix-aware routing saves {saved:.0f} of {gpus_round_robin:.0f} prefill GPUs")
    router = router_for_policy(best_policy)
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return Verdict(False, f"Not worth it: {failed[0]}{more}.", tuple(failed + unknown + passed),
                       router, best_policy)
    adopt = f"Adopt {router} rather than building a router."
    if unknown:
        headline = f"Likely worth it if the {len(unknown)} unchecked condition(s) below hold. {adopt}"
        return Verdict(None, headline,
                       tuple(passed + unknown), router, best_policy)
    return Verdict(True, f"Worth it. {adopt}", tuple(passed), router, best_policy)
