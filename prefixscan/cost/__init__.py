"""Cost model: the `estimate` computation, with the model and GPU catalogues, prefill FLOPs and KV capacity
(`prefixscan.hardware`) re-exported.

The names below are loaded from their modules on first use, so the CLI's help (which lists the model and
GPU catalogues) does not import the estimator.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "EstimateOptions": "cost.options", "estimate": "cost.estimator",
    "kv_capacity_tokens": "hardware.flops", "prefill_flops": "hardware.flops", "prefill_seconds": "hardware.flops",
    "GpuSpec": "hardware.gpus", "get_gpu": "hardware.gpus", "list_gpus": "hardware.gpus",
    "ModelSpec": "hardware.models", "get_model": "hardware.models", "list_models": "hardware.models",
    "load_hf_config": "hardware.models",
    "EstimateResult": "cost.result", "Scenario": "cost.result", "SensitivityRow": "cost.result",
    "Workload": "cost.result",
    "load_estimate": "cost.saved", "save_estimate": "cost.saved",
    "ScenarioSpec": "cost.scenario",
    "Verdict": "cost.verdict",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"prefixscan.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


__all__ = sorted(_WHERE)
