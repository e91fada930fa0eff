"""ReportData: everything `prefixscan report` shows, as plain values (`report.assemble` fills it in).

The results object and the constants that shape it (which breakdowns, how many rows, which columns, the
definitions printed at the end). This module never imports its renderers (markdown, html, figures);
`prefixscan.report.write` puts the two together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GIB = 2**30
TOP_PREFIXES = 10
TOP_TENANTS = 15
TOP_FINDINGS = 15
BREAKDOWNS = ("tenant", "prefix_class", "turn_index", "hit_source", "model", "category")
CLASSES = ("warm", "partial", "cold")  # a request by how much of what an unbounded cache holds it found cached
POLICY_COLUMNS = (
    "policy", "hit_rate_token_weighted", "capture_of_ideal", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
    "queue_wait_p95_s", "imbalance_max_mean", "spill_rate", "spill_rate_of_warm", "prefill_tokens", "cached_tokens",
    "prompt_tokens", "predicted_cached_tokens", "evictions", "evicted_age_mean_s", "requests",
    *(f"{k}_requests" for k in CLASSES), *(f"ttft_{k}_{p}_s" for k in CLASSES for p in ("p50", "p95")),
)
FINDING_COLUMNS = ("kind", "tenant", "message_index", "role", "char_offset", "token_offset", "requests_affected",
                   "tokens_lost", "example", "fix")

# Seed 002, "Roll it out in this order".
ROLLOUT = (
    "Collect several days of logs and calculate common token-prefix lengths, not just text matches.",
    "Fix the template and move changing fields after the cacheable block.",
    "Enable prefix caching in a limited pool and collect actual cached-token counts from the inference "
    "engine.",
    "Add warm preference with a strict wait limit and a cold fallback route.",
    "Compare warm, partial, and cold requests by time to first token, queue time, and evictions.",
)

DEFINITIONS = (
    ("token-weighted hit rate", "sum(cached tokens) / sum(prompt tokens): what vLLM's "
     "`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` counters show. The report's headline "
     "definition."),
    ("block-weighted hit rate", "hit blocks / all blocks."),
    ("mean of per-request hit fractions", "the average over requests of each request's hit fraction (hit blocks / "
     "blocks; AIPerf's headline): short prompts count as much as long ones."),
    ("whole log vs steady state", "steady state is the second half of the log (by request order), which removes the "
     "cold start."),
    ("ideal cache", "one unbounded cache shared by every request: the upper bound for any router."),
    ("LRU / optimal curve", "hit rate (token-weighted) of one cache of the given capacity under LRU eviction (vLLM "
     "order) and under Belady's optimal eviction with bypass (docs/capacity.md)."),
    ("cluster hit rate", "token-weighted over all replicas (sum cached / sum prompt), never a mean of per-replica "
     "rates."),
    ("warm / partial / cold", "warm: the replica held everything an unbounded cache would have (and that is > 0); "
     "partial: some but less; cold: nothing cached."),
    ("imbalance", "max / mean of per-replica outstanding requests, averaged over the run."),
    ("spill rate", "share of requests routed to a replica holding less of their prefix than the best replica did."),
    ("requests with a hit (cost table)", "share of requests with at least one prompt token cached: in a replay the "
     "simulator's warm + partial requests, for the ideal cache the requests it hits, for today the requests whose "
     "engine-reported cached tokens are above zero."),
    ("prompt tokens cached / of ideal (cost table)", "token-weighted hit rate H, and H over the ideal cache's rate: "
     "the h of the seeds' formula prefill tokens/s = rps x (h x new + (1 - h) x context) that prices each scenario."),
)


@dataclass(frozen=True)
class Traffic:
    requests_read: int
    requests_accepted: int
    requests_rejected: int
    rejects_by_reason: dict[str, int]
    span_s: float
    rps: float | None
    prompt_tokens: int
    cached_tokens: int
    prompt_p50: float
    prompt_p90: float
    prompt_p99: float
    output_tokens_mean: float | None
    tenants: int
    conversations: int
    models: int
    with_actual_cached: int
    actual_cached_tokens: int
    predicted_cached_tokens_for_actual: int
    busy_note: str | None = None  # a gappy log: its span, busy time and idle gaps (prefixscan.sim.rate)
    busy_rps: float | None = None  # a gappy log: requests / busy time


@dataclass(frozen=True)
class HitRate:
    name: str
    whole: float | None
    steady: float | None


@dataclass(frozen=True)
class Capacity:
    points: list[dict[str, float]]  # capacity_tokens, capacity_gib, lru/opt/ideal hit rates and tokens
    lru_tokens_50: int | None
    lru_tokens_90: int | None
    replica_kv_tokens: int | None


@dataclass(frozen=True)
class KvBasis:
    model: str
    dtype: str
    gpu: str
    bytes_per_token: float
    source: str


@dataclass
class ReportData:
    """The report's results object: render it with `markdown.render` or `html.render`."""

    run_path: str
    version: str
    commands: list[tuple[str, str]]
    inputs: list[dict[str, Any]]
    setup: dict[str, Any]
    kv: KvBasis
    traffic: Traffic | None = None
    hit_rates: list[HitRate] = field(default_factory=list)
    tenant_isolated: float | None = None
    breakdowns: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    breakdown_omitted: dict[str, int] = field(default_factory=dict)
    capacity: Capacity | None = None
    prefixes: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] | None = None
    findings_total: dict[str, int] = field(default_factory=dict)
    policies: list[dict[str, Any]] | None = None
    sim: dict[str, Any] = field(default_factory=dict)
    best_policy: str | None = None
    queue_by_decision: list[dict[str, Any]] = field(default_factory=list)
    simulation: str | None = None  # the stored simulation the report reads (`report --simulation`)
    sim_tiers: list[dict[str, Any]] = field(default_factory=list)  # its per-policy KV-tier results, if any
    sim_pd: list[dict[str, Any]] = field(default_factory=list)  # its disaggregated prefill/decode results
    estimate: dict[str, Any] | None = None
    estimate_source: str = ""
    scenario: str | None = None  # the one deployment every section is priced at (estimate's scenario)
    policies_source: str = ""  # where the policy table comes from: the saved simulation or the estimate
    estimate_error: str | None = None
    rollout: tuple[str, ...] = ROLLOUT
    definitions: tuple[tuple[str, str], ...] = DEFINITIONS
    missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    misses: dict[str, Any] | None = None  # analyze's miss attribution (summary["miss_attribution"])
    pilot: dict[str, Any] | None = None  # the `pilot` table's rows and summary["pilot"] (sections/pilot.py)
    comparison: Any = None  # prefixscan.compare.diff.DiffResult against an earlier run (report --compare-to)

    def policy(self, name: str | None) -> dict[str, Any] | None:
        return next((p for p in self.policies or [] if p["policy"] == name), None)
