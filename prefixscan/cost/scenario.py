"""The one deployment an estimate (and a report) is priced at: model, GPU, replicas, KV memory, rate, price.

Every option left unset is taken, in order, from the run's saved simulation (so `estimate RUN` and
`report RUN` price exactly what `simulate` replayed), then from the catalogue defaults. The replay that
gives the round-robin and router baselines runs at this scenario, and every section of a report names it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefixscan.cost import flops as F
from prefixscan.cost.gpus import GpuSpec, get_gpu
from prefixscan.cost.models import ModelSpec, get_model, load_hf_config, override
from prefixscan.errors import UsageError

if TYPE_CHECKING:
    from prefixscan.cost.estimator import EstimateOptions
    from prefixscan.cost.measure import MeasuredWorkload

DEFAULT_MODEL = "llama-3.1-70b"
DEFAULT_GPU = "h100"
DEFAULT_DTYPE = "bf16"
DEFAULT_MFU = 0.5
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default


@dataclass(frozen=True)
class ScenarioSpec:
    """The deployment being priced. `rps_source` says where the rate came from."""

    model: ModelSpec
    gpu: GpuSpec
    dtype: str
    kv_dtype: str
    tensor_parallel: int
    gpu_memory_utilization: float
    replicas: int
    kv_tokens_per_replica: int
    block_size: int
    rps: float | None  # None only when flags give no rate (then estimate raises)
    rps_source: str
    mfu: float

    @property
    def kv_blocks_per_replica(self) -> int:
        return self.kv_tokens_per_replica // max(self.block_size, 1)

    def describe(self) -> str:
        """One line naming the scenario, printed at the top of `estimate` and of the report."""
        rate = "rate not set" if self.rps is None else f"{self.rps:,.4g} req/s ({self.rps_source})"
        return (f"{self.replicas} replicas of {self.model.name} ({self.dtype}, TP{self.tensor_parallel}) on "
                f"{self.gpu.name}, {self.kv_tokens_per_replica:,} KV tokens per replica, {rate}, "
                f"${self.gpu.usd_per_hour:.2f}/GPU-hour")

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model.name, "gpu": self.gpu.name, "dtype": self.dtype, "kv_dtype": self.kv_dtype,
                "tensor_parallel": self.tensor_parallel, "gpu_memory_utilization": self.gpu_memory_utilization,
                "replicas": self.replicas, "kv_tokens_per_replica": self.kv_tokens_per_replica,
                "kv_blocks_per_replica": self.kv_blocks_per_replica, "block_size": self.block_size,
                "rps": self.rps, "rps_source": self.rps_source, "mfu": self.mfu,
                "usd_per_gpu_hour": self.gpu.usd_per_hour, "description": self.describe()}


def resolve_model(o: EstimateOptions, sim: dict[str, Any]) -> ModelSpec:
    """Catalogue entry or local config.json, with --params / --active-params applied."""
    spec = load_hf_config(o.model_config) if o.model_config else get_model(
        o.model or sim.get("model") or DEFAULT_MODEL)
    return override(spec, o.params, o.active_params)


def resolve_gpu(o: EstimateOptions, sim: dict[str, Any], dtype: str) -> GpuSpec:
    """Catalogue GPU with --gpu-flops (for the chosen dtype), --gpu-memory-gb, --usd-per-gpu-hour applied."""
    gpu = get_gpu(o.gpu or sim.get("gpu") or DEFAULT_GPU)
    if o.gpu_flops is not None:
        gpu.flops(dtype)  # validates the dtype name
        fp8 = dtype.lower() not in ("bf16", "fp16", "float16", "bfloat16")
        gpu = dataclasses.replace(gpu, **{"fp8_flops" if fp8 else "bf16_flops": o.gpu_flops})
    if o.gpu_memory_gb is not None:
        gpu = dataclasses.replace(gpu, memory_bytes=o.gpu_memory_gb * 1e9)
    if o.usd_per_gpu_hour is not None:
        gpu = dataclasses.replace(gpu, usd_per_hour=o.usd_per_gpu_hour)
    return gpu


def _sim_rate(m: MeasuredWorkload) -> float | None:
    """The request rate the saved simulation replayed at, when it compressed or stretched time."""
    cfg = m.sim_config or {}
    if cfg.get("target_rps"):
        return float(cfg["target_rps"])
    scale = cfg.get("rate_scale")
    if scale and float(scale) != 1.0 and math.isfinite(m.rps):
        return m.rps * float(scale)
    return None


def _rate(o: EstimateOptions, m: MeasuredWorkload | None) -> tuple[float | None, str]:
    if o.scale_to_rps:
        return o.scale_to_rps, "--scale-to-rps"
    if o.rps:
        return o.rps, "--rps"
    if m is None:
        return None, "not set"
    sim_rate = _sim_rate(m)
    if sim_rate is not None:
        return sim_rate, "the saved simulation's rate"
    return m.rps, "measured"


def resolve_scenario(o: EstimateOptions, m: MeasuredWorkload | None) -> ScenarioSpec:
    """Options, else the saved simulation's settings, else catalogue defaults."""
    sim = (m.sim_config if m else None) or {}
    model = resolve_model(o, sim)
    dtype = o.dtype or sim.get("dtype") or DEFAULT_DTYPE
    gpu = resolve_gpu(o, sim, dtype)
    kv_dtype = o.kv_dtype or dtype
    gmu = o.gpu_memory_utilization or sim.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION
    wbytes, kvbytes = F.dtype_bytes(dtype), F.dtype_bytes(kv_dtype)
    same_hw = bool(sim) and (model.name, gpu.name, dtype, kv_dtype) == (
        _name(sim.get("model"), get_model), _name(sim.get("gpu"), get_gpu), sim.get("dtype"), sim.get("dtype"))
    tp = o.tensor_parallel or (int(sim["tensor_parallel"]) if same_hw and sim.get("tensor_parallel") else
                               F.default_tensor_parallel(model, gpu, wbytes, gmu))
    replicas = o.replicas or (m.replicas if m else None)
    if replicas is None:
        raise UsageError("pass --replicas (how many engine replicas serve this traffic)")
    bs = m.block_size if m else 16
    kv_tokens = _kv_tokens(o, m, sim, same_hw and tp == sim.get("tensor_parallel") and gmu == sim.get(
        "gpu_memory_utilization"), bs, lambda: F.kv_capacity_tokens(model, gpu, kvbytes, tp, gmu, wbytes))
    if m is not None:  # a run is replayed in whole blocks: price the memory the replay has
        kv_tokens = kv_tokens // bs * bs
    rps, source = _rate(o, m)
    mfu = o.mfu or sim.get("mfu") or DEFAULT_MFU
    return ScenarioSpec(model, gpu, dtype, kv_dtype, tp, float(gmu), int(replicas), int(kv_tokens), bs, rps,
                        source, float(mfu))


def _name(value: Any, lookup: Any) -> str | None:
    try:
        return lookup(value).name if value else None
    except UsageError:
        return None


def _kv_tokens(o: EstimateOptions, m: MeasuredWorkload | None, sim: dict[str, Any], same_hw: bool, bs: int,
               derive: Any) -> int:
    """--kv-blocks, else the saved simulation's replica memory (same hardware), else derived from it."""
    if o.kv_blocks is not None:
        return int(o.kv_blocks) * bs
    wl = (m.sim_workload if m else None) or {}
    if sim.get("kv_blocks") is not None and not o.model and not o.gpu:
        return int(sim["kv_blocks"]) * bs
    if same_hw and wl.get("kv_blocks_per_replica") and not wl.get("unbounded_kv"):
        return int(wl["kv_blocks_per_replica"]) * bs
    return int(derive())
