"""Cost model: model and GPU catalogues, prefill FLOPs, KV capacity, and the `estimate` computation."""

from prefixscan.cost.estimator import EstimateOptions, estimate
from prefixscan.cost.flops import kv_capacity_tokens, prefill_flops, prefill_seconds
from prefixscan.cost.gpus import GpuSpec, get_gpu, list_gpus
from prefixscan.cost.models import ModelSpec, get_model, list_models, load_hf_config
from prefixscan.cost.result import EstimateResult, Scenario, SensitivityRow, Workload
from prefixscan.cost.saved import load_estimate, save_estimate
from prefixscan.cost.scenario import ScenarioSpec
from prefixscan.cost.verdict import Verdict

__all__ = [
    "EstimateOptions", "EstimateResult", "GpuSpec", "ModelSpec", "Scenario", "ScenarioSpec", "SensitivityRow",
    "Verdict", "Workload", "estimate", "get_gpu", "get_model", "kv_capacity_tokens", "list_gpus", "list_models",
    "load_estimate", "load_hf_config", "prefill_flops", "prefill_seconds", "save_estimate",
]
