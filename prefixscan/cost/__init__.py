"""Cost model: model and GPU catalogues, prefill FLOPs, KV capacity, and the `estimate` computation."""

from prefixscan.cost.estimator import (
    EstimateOptions,
    EstimateResult,
    Scenario,
    SensitivityRow,
    Workload,
    estimate,
)
from prefixscan.cost.flops import kv_capacity_tokens, prefill_flops, prefill_seconds
from prefixscan.cost.gpus import GpuSpec, get_gpu, list_gpus
from prefixscan.cost.models import ModelSpec, get_model, list_models, load_hf_config
from prefixscan.cost.verdict import Verdict

__all__ = [
    "EstimateOptions", "EstimateResult", "GpuSpec", "ModelSpec", "Scenario", "SensitivityRow", "Verdict",
    "Workload", "estimate", "get_gpu", "get_model", "kv_capacity_tokens", "list_gpus", "list_models",
    "load_hf_config", "prefill_flops", "prefill_seconds",
]
