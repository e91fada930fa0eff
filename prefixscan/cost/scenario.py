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

from prefixscan.errors import UsageError
from prefixscan.hardware import flops as F
from prefixscan.hardware.gpus import GpuSpec, get_gpu
from prefixscan.hardware.models import ModelSpec, get_model, load_hf_config, override

if TYPE_CHECKING:
    from prefixscan.cost.measure import MeasuredWorkload
    from prefixscan.cost.options import EstimateOptions

DEFAULT_MODEL = "llama-3.1-70b"
DEFAULT_GPU = "h100"
DEFAULT_DTYPE = "bf16"
DEFAULT_MFU = 0.5
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default

# Where a scenario value came from (ScenarioSpec.sources; the report prints them).
FLAG = "flag"
SAVED = "saved estimate"
CONFIG = "prefixscan.toml"
SIMULATION = "saved simulation"
MEASURED = "measured"
BUSY = "measured over the log's busy periods"
DEFAULT = "default"
DERIVED = "derived"
# Scenario fields by their EstimateOptions name, in the order a report lists them.
FIELDS = ("replicas", "rps", "model", "gpu", "dtype", "kv_dtype", "tensor_parallel", "gpu_memory_utilization",
          "kv_blocks", "mfu", "usd_per_gpu_hour")


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
    sources: dict[str, str] = dataclasses.field(default_factory=dict)  # FIELDS -> FLAG, SAVED, CONFIG, ...

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
                "usd_per_gpu_hour": self.gpu.usd_per_hour, "description": self.describe(),
                "sources": dict(self.sources)}


_LABELS = {"replicas": "replicas", "rps": "rate", "model": "model", "gpu": "GPU", "dtype": "dtype",
           "kv_dtype": "KV dtype", "tensor_parallel": "tensor parallel (GPUs per replica)",
           "gpu_memory_utilization": "GPU memory utilization", "kv_blocks": "KV blocks per replica",
           "mfu": "MFU", "usd_per_gpu_hour": "price"}


def source_rows(scenario: dict[str, Any]) -> list[list[str]]:
    """[setting, value, where it came from] for each scenario value of a saved or fresh estimate's
    "scenario" dict (ScenarioSpec.to_json), in FIELDS order; the report prints them under the scenario."""
    sources = scenario.get("sources") or {}
    rows = []
    for f in FIELDS:
        v = scenario.get("kv_blocks_per_replica" if f == "kv_blocks" else f)
        if v is None:
            continue
        src = sources.get(f)
        if f == "rps":  # measured: say how (busy periods or the whole log); older files: their rps_source
            text, src = f"{v:,.4g} req/s", scenario.get("rps_source", "") if src in (None, MEASURED) else src
        elif f == "usd_per_gpu_hour":
            text = f"${v:.2f}/GPU-hour"
        elif isinstance(v, float):
            text = f"{v:g}"
        elif isinstance(v, int):
            text = f"{v:,}"
        else:
            text = str(v)
        if src in ("--rps", "--scale-to-rps"):
            src = FLAG
        rows.append([_LABELS[f], text, src or "not recorded (an older estimate.json)"])
    return rows


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
        gpu = dataclasses.replace(gpu, **{"fp8_flops" if fp8 else "bf16_flops": o.gpu_flops})  # type: ignore[arg-type]  # a float field
    if o.gpu_memory_gb is not None:
        gpu = dataclasses.replace(gpu, memory_bytes=o.gpu_memory_gb * 1e9)
    if o.usd_per_gpu_hour is not None:
        gpu = dataclasses.replace(gpu, usd_per_hour=o.usd_per_gpu_hour)
    return gpu


def sim_rate(m: MeasuredWorkload) -> float | None:
    """The request rate the saved simulation replayed at, when it compressed or stretched time (None: the
    log's own rate)."""
    cfg = m.sim_config or {}
    if cfg.get("target_rps"):
        return float(cfg["target_rps"])
    scale = cfg.get("rate_scale")
    if scale and float(scale) != 1.0 and math.isfinite(m.rps):
        return m.rps * float(scale)
    return None


def _given(o: EstimateOptions, name: str) -> str:
    """Where an option the caller set came from: a flag unless `EstimateOptions.sources` says otherwise."""
    return o.sources.get(name, FLAG)


def _rate(o: EstimateOptions, m: MeasuredWorkload | None) -> tuple[float | None, str, str]:
    """(rate, how `describe` names its origin, its source label)."""
    rate = o.rps or o.scale_to_rps  # --scale-to-rps is the old name of --rps (same meaning on a run)
    if rate:
        src = _given(o, "rps" if o.rps else "scale_to_rps")
        return rate, ("--rps" if src == FLAG else src), src
    if m is None:
        return None, "not set", "not set"
    saved = sim_rate(m)
    if saved is not None:
        return saved, "the saved simulation's rate", SIMULATION
    if m.gappy:
        return m.rps, BUSY, MEASURED
    return m.rps, MEASURED, MEASURED


def resolve_scenario(o: EstimateOptions, m: MeasuredWorkload | None) -> ScenarioSpec:
    """Options, else the saved simulation's settings, else catalogue defaults; records where each came from."""
    sim = (m.sim_config if m else None) or {}
    src: dict[str, str] = {}

    def pick(name: str, given: Any, default: Any, sim_key: str | None = None) -> Any:
        if given is not None:
            src[name] = _given(o, name)
            return given
        if sim.get(sim_key or name) is not None:
            src[name] = SIMULATION
            return sim[sim_key or name]
        src[name] = DEFAULT
        return default

    model = resolve_model(o, sim)
    src["model"] = (_given(o, "model_config") if o.model_config else _given(o, "model") if o.model else
                    SIMULATION if sim.get("model") else DEFAULT)
    dtype = pick("dtype", o.dtype, DEFAULT_DTYPE)
    gpu = resolve_gpu(o, sim, dtype)
    src["gpu"] = _given(o, "gpu") if o.gpu else SIMULATION if sim.get("gpu") else DEFAULT
    src["usd_per_gpu_hour"] = _given(o, "usd_per_gpu_hour") if o.usd_per_gpu_hour is not None else "GPU catalogue"
    kv_dtype = o.kv_dtype or dtype
    src["kv_dtype"] = _given(o, "kv_dtype") if o.kv_dtype else DERIVED
    gmu = pick("gpu_memory_utilization", o.gpu_memory_utilization, DEFAULT_GPU_MEMORY_UTILIZATION)
    wbytes, kvbytes = F.dtype_bytes(dtype), F.dtype_bytes(kv_dtype)
    same_hw = bool(sim) and (model.name, gpu.name, dtype, kv_dtype) == (
        _name(sim.get("model"), get_model), _name(sim.get("gpu"), get_gpu), sim.get("dtype"), sim.get("dtype"))
    if o.tensor_parallel:
        tp, src["tensor_parallel"] = o.tensor_parallel, _given(o, "tensor_parallel")
    elif same_hw and sim.get("tensor_parallel"):
        tp, src["tensor_parallel"] = int(sim["tensor_parallel"]), SIMULATION
    else:
        tp, src["tensor_parallel"] = F.default_tensor_parallel(model, gpu, wbytes, gmu), DERIVED
    replicas = o.replicas or (m.replicas if m else None)
    if replicas is None:
        raise UsageError("pass --replicas (how many engine replicas serve this traffic)")
    src["replicas"] = _given(o, "replicas") if o.replicas else SIMULATION
    bs = m.block_size if m else 16
    kv_tokens, src["kv_blocks"] = _kv_tokens(
        o, m, sim, same_hw and tp == sim.get("tensor_parallel") and gmu == sim.get("gpu_memory_utilization"), bs,
        lambda: F.kv_capacity_tokens(model, gpu, kvbytes, tp, gmu, wbytes))
    if m is not None:  # a run is replayed in whole blocks: price the memory the replay has
        kv_tokens = kv_tokens // bs * bs
    rps, rps_source, src["rps"] = _rate(o, m)
    mfu = pick("mfu", o.mfu, DEFAULT_MFU)
    return ScenarioSpec(model, gpu, dtype, kv_dtype, tp, float(gmu), int(replicas), int(kv_tokens), bs, rps,
                        rps_source, float(mfu), src)


def _name(value: Any, lookup: Any) -> str | None:
    try:
        return lookup(value).name if value else None
    except UsageError:
        return None


def _kv_tokens(o: EstimateOptions, m: MeasuredWorkload | None, sim: dict[str, Any], same_hw: bool, bs: int,
               derive: Any) -> tuple[int, str]:
    """--kv-blocks, else the saved simulation's replica memory (same hardware), else derived from it."""
    if o.kv_blocks is not None:
        return int(o.kv_blocks) * bs, _given(o, "kv_blocks")
    wl = (m.sim_workload if m else None) or {}
    if sim.get("kv_blocks") is not None and not o.model and not o.gpu:
        return int(sim["kv_blocks"]) * bs, SIMULATION
    if same_hw and wl.get("kv_blocks_per_replica") and not wl.get("unbounded_kv"):
        return int(wl["kv_blocks_per_replica"]) * bs, SIMULATION
    return int(derive()), DERIVED
