"""Cost model: model and GPU catalogues, prefill FLOPs, KV capacity, and the `estimate` computation.

The names below are loaded from their modules on first use, so the CLI's help (which lists the model and
GPU catalogues) does not import the estimator.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "EstimateOptions": "options", "estimate": "estimator",
    "kv_capacity_tokens": "flops", "prefill_flops": "flops", "prefill_seconds": "flops",
    "GpuSpec": "gpus", "get_gpu": "gpus", "list_gpus": "gpus",
    "ModelSpec": "models", "get_model": "models", "list_models": "models", "load_hf_config": "models",
    "EstimateResult": "result", "Scenario": "result", "SensitivityRow": "result", "Workload": "result",
    "load_estimate": "saved", "save_estimate": "saved",
    "ScenarioSpec": "scenario",
    "Verdict": "verdict",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "EstimateOptions", "EstimateResult", "GpuSpec", "ModelSpec", "Scenario", "ScenarioSpec", "SensitivityRow",
    "Verdict", "Workload", "estimate", "get_gpu", "get_model", "kv_capacity_tokens", "list_gpus", "list_models",
    "load_estimate", "load_hf_config", "prefill_flops", "prefill_seconds", "save_estimate",
]
