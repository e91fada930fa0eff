"""What `estimate` accepts (`EstimateOptions`) and its defaults, with no dependency: the scenario resolver,
the replay and the estimator all take these options, and the CLI reads the defaults without importing
the estimator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Replayed on the fly when no saved simulation matches: SGLang's cache_aware is the router the verdict
# recommends without other evidence (prefixscan.cost.verdict.router_for_policy).
ROUTER_POLICIES = ("sglang_cache_aware",)

HOURS_PER_MONTH = 730.0  # 8,760 h / 12
# Fixed TTFT overhead: Preble's fitted prefill-time intercept, Llama-3-70B on H100, is 28.93 ms
# (docs/engines.md, 'Preble E2').
TTFT_OVERHEAD_S = 0.03


@dataclass(frozen=True)
class EstimateOptions:
    """Everything `prefixscan estimate` accepts; None means "take it from the run's simulation or defaults"."""

    model: str | None = None  # None: the simulation's model when the run has one, else llama-3.1-70b
    model_config: str | None = None
    params: float | None = None
    active_params: float | None = None
    gpu: str | None = None  # None: the simulation's GPU, else h100
    gpu_flops: float | None = None
    gpu_memory_gb: float | None = None
    usd_per_gpu_hour: float | None = None
    dtype: str | None = None  # None: the simulation's dtype, else bf16
    kv_dtype: str | None = None
    mfu: float | None = None  # None: the simulation's, else 0.5
    linear: bool = False
    replicas: int | None = None
    tensor_parallel: int | None = None
    gpu_memory_utilization: float | None = None  # None: the simulation's, else 0.9 (vLLM)
    kv_blocks: int | None = None  # KV blocks per replica (None: derived from model, GPU, TP and memory)
    rps: float | None = None  # the traffic's rate; on a run the replay compresses the log's busy periods to it
    scale_to_rps: float | None = None  # the old name of `rps` (kept so existing callers work)
    context_tokens: float | None = None
    new_tokens: float | None = None
    output_tokens: float | None = None
    hit_rate: float | None = None
    token_hit_rate: float | None = None
    policies: tuple[str, ...] = ROUTER_POLICIES  # router policies replayed when no saved simulation matches
    ttft_gpus: float = 1.0
    ttft_overhead_s: float = TTFT_OVERHEAD_S
    decode_batch: int = 64
    hours_per_month: float = HOURS_PER_MONTH
    # where a given option came from, by field name, when not a flag: "prefixscan.toml", "saved estimate"
    sources: dict[str, str] = field(default_factory=dict)
