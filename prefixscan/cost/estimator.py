"""`estimate`: prefill GPUs and dollars under no reuse, round robin, prefix-aware routing and an ideal cache.

A request has `context` prompt tokens of which the last `new` can never be cached (the new turn). On a
hit it prefills only `new` (reusing context - new); on a miss it prefills all `context`. With hit
probability h, prefill tokens/s = rps * (h*new + (1-h)*context) (seed 000). Round robin hits with
h = 1/replicas; an ideal cache hits always. Measured token-weighted hit rates H convert with
h = H * context / (context - new). GPUs = prefill FLOP/s / (peak dense FLOP/s x MFU).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from prefixscan.cost import flops as F
from prefixscan.cost.gpus import GpuSpec, get_gpu
from prefixscan.cost.measure import MeasuredWorkload, measure_run
from prefixscan.cost.models import ModelSpec, get_model, load_hf_config, override
from prefixscan.cost.verdict import Verdict, adoptable, decide
from prefixscan.errors import UsageError

HOURS_PER_MONTH = 730.0  # 8,760 h / 12
# Fixed TTFT overhead: Preble's fitted prefill-time intercept, Llama-3-70B on H100, is 28.93 ms (REFERENCE 6).
TTFT_OVERHEAD_S = 0.03


@dataclass(frozen=True)
class EstimateOptions:
    """Everything `prefixscan estimate` accepts; None means "take it from the run or the catalogue"."""

    model: str | None = None  # None: the simulation's model when the run has one, else DEFAULT_MODEL
    model_config: str | None = None
    params: float | None = None
    active_params: float | None = None
    gpu: str = "h100"
    gpu_flops: float | None = None
    gpu_memory_gb: float | None = None
    usd_per_gpu_hour: float | None = None
    dtype: str = "bf16"
    kv_dtype: str | None = None
    mfu: float = 0.5
    linear: bool = False
    replicas: int | None = None
    tensor_parallel: int | None = None
    gpu_memory_utilization: float = 0.9
    rps: float | None = None
    scale_to_rps: float | None = None
    context_tokens: float | None = None
    new_tokens: float | None = None
    output_tokens: float | None = None
    hit_rate: float | None = None
    token_hit_rate: float | None = None
    ttft_gpus: float = 1.0
    ttft_overhead_s: float = TTFT_OVERHEAD_S
    decode_batch: int = 64
    hours_per_month: float = HOURS_PER_MONTH


@dataclass(frozen=True)
class Workload:
    """The traffic being costed: rate, mean context, mean uncachable (new) tokens, mean output."""

    rps: float
    context_tokens: float
    new_tokens: float
    output_tokens: float | None
    source: str  # "flags" or the run directory
    measured_rps: float | None = None
    requests: int | None = None
    ideal_hit_rate_token_weighted: float | None = None

    @property
    def reusable_fraction(self) -> float:
        """Share of a prompt a hit reuses: (context - new) / context."""
        return (self.context_tokens - self.new_tokens) / self.context_tokens


@dataclass(frozen=True)
class Scenario:
    """Prefill load and GPUs under one routing assumption. hit_rate is per request (seed convention)."""

    name: str
    hit_rate: float
    hit_rate_token_weighted: float
    prefill_tokens_s: float
    prefill_flops_s: float
    gpus: float
    usd_per_month: float
    source: str = ""
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None


@dataclass(frozen=True)
class SensitivityRow:
    parameter: str
    value: float
    gpus_prefix_aware: float
    monthly_savings_usd: float


@dataclass(frozen=True)
class EstimateResult:
    """Result of `estimate`; reporters render it, `to_json` is the stable machine form."""

    model: ModelSpec
    gpu: GpuSpec
    dtype: str
    kv_dtype: str
    mfu: float
    linear: bool
    replicas: int
    tensor_parallel: int
    usd_per_gpu_hour: float
    hours_per_month: float
    workload: Workload
    per_gpu_prefill_tokens_s: float
    scenarios: tuple[Scenario, ...]  # no_reuse, round_robin, prefix_aware, ideal
    policies: tuple[Scenario, ...]  # one per simulated policy, when the run has sim_policies
    monthly_gpu_hours_saved: float
    monthly_savings_usd: float
    monthly_savings_vs_no_reuse_usd: float
    ttft_hit_s: float
    ttft_miss_s: float
    ttft_idle_hit_s: float
    ttft_idle_miss_s: float
    kv_bytes_per_token: float
    kv_capacity_tokens_per_replica: int
    prefill_share: float | None
    sensitivity: tuple[SensitivityRow, ...]
    verdict: Verdict
    notes: tuple[str, ...]

    def scenario(self, name: str) -> Scenario:
        return next(s for s in self.scenarios if s.name == name)

    def to_json(self) -> dict:
        """Plain dict for `--json`; the keys gpus, monthly_savings_usd and ttft_s are a stable contract."""
        asdict = dataclasses.asdict
        return {
            "gpus": {s.name: s.gpus for s in self.scenarios},
            "monthly_savings_usd": self.monthly_savings_usd,
            "monthly_savings_vs_no_reuse_usd": self.monthly_savings_vs_no_reuse_usd,
            "monthly_gpu_hours_saved": self.monthly_gpu_hours_saved,
            "ttft_s": {"hit": self.ttft_hit_s, "miss": self.ttft_miss_s},
            "ttft_idle_s": {"hit": self.ttft_idle_hit_s, "miss": self.ttft_idle_miss_s},
            "scenarios": [asdict(s) for s in self.scenarios],
            "policies": [asdict(s) for s in self.policies],
            "workload": asdict(self.workload),
            "model": asdict(self.model),
            "gpu": asdict(self.gpu),
            "assumptions": {
                "dtype": self.dtype, "kv_dtype": self.kv_dtype, "mfu": self.mfu, "linear": self.linear,
                "replicas": self.replicas, "tensor_parallel": self.tensor_parallel,
                "usd_per_gpu_hour": self.usd_per_gpu_hour, "hours_per_month": self.hours_per_month,
                "per_gpu_prefill_tokens_s": self.per_gpu_prefill_tokens_s,
            },
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_capacity_tokens_per_replica": self.kv_capacity_tokens_per_replica,
            "prefill_share": self.prefill_share,
            "sensitivity": [asdict(r) for r in self.sensitivity],
            "verdict": self.verdict.to_json(),
            "notes": list(self.notes),
        }


def _positive(name: str, value: float | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        raise UsageError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _fraction(name: str, value: float | None) -> None:
    if value is not None and not 0 <= value <= 1:
        raise UsageError(f"{name} must be between 0 and 1, got {value}")


def _validate(o: EstimateOptions) -> None:
    for name, v in [("--params", o.params), ("--active-params", o.active_params),
                    ("--gpu-flops", o.gpu_flops),
                    ("--gpu-memory-gb", o.gpu_memory_gb), ("--usd-per-gpu-hour", o.usd_per_gpu_hour),
                    ("--replicas", o.replicas), ("--tensor-parallel", o.tensor_parallel), ("--rps", o.rps),
                    ("--scale-to-rps", o.scale_to_rps), ("--context-tokens", o.context_tokens),
                    ("--ttft-gpus", o.ttft_gpus), ("--decode-batch", o.decode_batch),
                    ("--hours-per-month", o.hours_per_month)]:
        _positive(name, v)
    _positive("--new-tokens", o.new_tokens, allow_zero=True)
    _positive("--output-tokens", o.output_tokens, allow_zero=True)
    _positive("--ttft-overhead-s", o.ttft_overhead_s, allow_zero=True)
    _fraction("--hit-rate", o.hit_rate)
    _fraction("--token-hit-rate", o.token_hit_rate)
    if not 0 < o.mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], got {o.mfu}")
    if not 0 < o.gpu_memory_utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {o.gpu_memory_utilization}")
    if o.hit_rate is not None and o.token_hit_rate is not None:
        raise UsageError("pass either --hit-rate (share of requests that hit) or --token-hit-rate, not both")


DEFAULT_MODEL = "llama-3.1-70b"


def resolve_model(o: EstimateOptions, run_dir: str | os.PathLike[str] | None = None) -> ModelSpec:
    """Catalogue entry or local config.json, with --params / --active-params applied.

    Without --model, a run that was simulated is priced with the simulation's model, so `estimate` and
    `report` agree with the simulated TTFTs.
    """
    name = o.model
    if name is None and run_dir is not None:
        from prefixscan.io.rundir import read_manifest

        name = (read_manifest(run_dir).get("simulate") or {}).get("config", {}).get("model")
    spec = load_hf_config(o.model_config) if o.model_config else get_model(name or DEFAULT_MODEL)
    return override(spec, o.params, o.active_params)


def resolve_gpu(o: EstimateOptions) -> GpuSpec:
    """Catalogue GPU with --gpu-flops (for the chosen dtype), --gpu-memory-gb, --usd-per-gpu-hour applied."""
    gpu = get_gpu(o.gpu)
    if o.gpu_flops is not None:
        gpu.flops(o.dtype)  # validates the dtype name
        fp8 = o.dtype.lower() not in ("bf16", "fp16", "float16", "bfloat16")
        gpu = dataclasses.replace(gpu, **{"fp8_flops" if fp8 else "bf16_flops": o.gpu_flops})
    if o.gpu_memory_gb is not None:
        gpu = dataclasses.replace(gpu, memory_bytes=o.gpu_memory_gb * 1e9)
    if o.usd_per_gpu_hour is not None:
        gpu = dataclasses.replace(gpu, usd_per_hour=o.usd_per_gpu_hour)
    return gpu


def _workload(o: EstimateOptions, m: MeasuredWorkload | None, source: str) -> Workload:
    rps = o.scale_to_rps or o.rps or (m.rps if m else None)
    context = o.context_tokens or (m.context_tokens if m else None)
    new = o.new_tokens if o.new_tokens is not None else (m.new_tokens if m else None)
    given = [("--rps", rps), ("--context-tokens", context), ("--new-tokens", new)]
    missing = [f for f, v in given if v is None]
    if missing:
        raise UsageError(f"without a run directory pass {', '.join(missing)} (or give RUN_DIR)")
    if rps != rps:  # NaN: all arrivals at one instant
        raise UsageError("cannot measure a request rate: all requests share one arrival time; pass --rps")
    if context <= 0:
        raise UsageError(f"mean context is {context:g} tokens; nothing to prefill (check the requests table)")
    if new > context:
        raise UsageError(f"--new-tokens ({new:g}) cannot exceed --context-tokens ({context:g})")
    output = o.output_tokens if o.output_tokens is not None else (m.output_tokens if m else None)
    return Workload(rps=float(rps), context_tokens=float(context), new_tokens=float(new),
                    output_tokens=output, source=source, measured_rps=m.rps if m else None,
                    requests=m.requests if m else None,
                    ideal_hit_rate_token_weighted=m.ideal_hit_rate_token_weighted if m else None)


class _Calc:
    """The arithmetic shared by scenarios and the sensitivity table."""

    def __init__(self, wl: Workload, model: ModelSpec, gpu: GpuSpec, dtype: str, mfu: float, linear: bool,
                 hours: float) -> None:
        self.wl, self.model, self.gpu, self.dtype, self.mfu, self.linear, self.hours = (
            wl, model, gpu, dtype, mfu, linear, hours)
        c, n = wl.context_tokens, wl.new_tokens
        self.hit_flops = F.prefill_flops(n, c - n, model, linear)
        self.miss_flops = F.prefill_flops(c, 0, model, linear)

    def token_weighted(self, h: float) -> float:
        return h * self.wl.reusable_fraction

    def from_token_weighted(self, big_h: float) -> float:
        r = self.wl.reusable_fraction
        return 0.0 if r <= 0 else min(1.0, max(0.0, big_h / r))

    def scenario(self, name: str, h: float, source: str = "", mfu: float | None = None,
                 price: float | None = None) -> Scenario:
        wl = self.wl
        tokens = wl.rps * (h * wl.new_tokens + (1 - h) * wl.context_tokens)
        flops_s = wl.rps * (h * self.hit_flops + (1 - h) * self.miss_flops)
        gpus = flops_s / F.effective_flops(self.gpu, self.dtype, mfu or self.mfu)
        usd = gpus * self.hours * (self.gpu.usd_per_hour if price is None else price)
        return Scenario(name, h, self.token_weighted(h), tokens, flops_s, gpus, usd, source)


def estimate(options: EstimateOptions, run_dir: str | os.PathLike[str] | None = None) -> EstimateResult:
    """Prefill GPUs, dollars, TTFT and a verdict, from flags alone or from a run directory."""
    o = options
    _validate(o)
    model, gpu = resolve_model(o, run_dir), resolve_gpu(o)
    kv_dtype = o.kv_dtype or o.dtype
    wbytes, kvbytes = F.dtype_bytes(o.dtype), F.dtype_bytes(kv_dtype)
    measured = measure_run(run_dir) if run_dir is not None else None
    wl = _workload(o, measured, str(run_dir) if run_dir is not None else "flags")
    replicas = o.replicas or (measured.replicas if measured else None)
    if replicas is None:
        raise UsageError("pass --replicas (how many engine replicas serve this traffic)")
    tp = o.tensor_parallel or F.default_tensor_parallel(model, gpu, wbytes, o.gpu_memory_utilization)
    kv_cap = F.kv_capacity_tokens(model, gpu, kvbytes, tp, o.gpu_memory_utilization, wbytes)
    calc = _Calc(wl, model, gpu, o.dtype, o.mfu, o.linear, o.hours_per_month)
    notes: list[str] = []
    if measured and measured.policies and measured.replicas and replicas != measured.replicas:
        notes.append(f"policies were simulated on {measured.replicas} replicas but --replicas is {replicas}; "
                     "their hit rates are used as simulated")
    if kv_cap == 0:
        notes.append(f"the weights do not fit on {tp} x {gpu.name} at this dtype; raise --tensor-parallel")
    if o.scale_to_rps and measured is not None:
        notes.append(f"rate scaled from measured {measured.rps:.3g} req/s to {o.scale_to_rps:g} req/s; "
                     "hit rates are assumed unchanged (more traffic usually means more reuse, "
                     "so this is conservative)")

    policies = _policy_scenarios(calc, measured)
    pa_h, pa_source, best_policy = _prefix_aware_hit(o, calc, measured, policies, kv_cap, notes)
    rr_sim = next((p for p in policies if p.name.lower().replace("-", "_") in ("round_robin", "rr")), None)
    rr = (dataclasses.replace(rr_sim, name="round_robin", source="simulated round_robin") if rr_sim
          else calc.scenario("round_robin", 1.0 / replicas, f"hit chance 1/{replicas} replicas"))
    scenarios = (calc.scenario("no_reuse", 0.0, "every prompt prefilled in full"), rr,
                 calc.scenario("prefix_aware", pa_h, pa_source),
                 calc.scenario("ideal", 1.0, "every request reuses all but its new tokens"))
    pa = scenarios[2]
    saved_gpus = rr.gpus - pa.gpus
    price = gpu.usd_per_hour

    def ttft(gpus: float) -> tuple[float, float]:
        c, n = wl.context_tokens, wl.new_tokens
        hit = F.prefill_seconds(n, c - n, model, gpu, o.dtype, o.mfu, o.linear, gpus)
        miss = F.prefill_seconds(c, 0, model, gpu, o.dtype, o.mfu, o.linear, gpus)
        return o.ttft_overhead_s + hit, o.ttft_overhead_s + miss

    hit_s, miss_s = ttft(o.ttft_gpus)
    idle_hit_s, idle_miss_s = ttft(float(tp))
    share = None
    if wl.output_tokens is not None:
        mean_kv = wl.context_tokens + wl.output_tokens / 2  # KV read per step, averaged over the output
        per_tok = F.decode_gpu_seconds_per_token(model, gpu, o.dtype, mean_kv, kvbytes, o.decode_batch, o.mfu)
        decode_gpus = wl.rps * wl.output_tokens * per_tok
        share = rr.gpus / (rr.gpus + decode_gpus) if rr.gpus + decode_gpus > 0 else None
    repetition_measured = measured is not None
    verdict = decide(repetition_measured=repetition_measured,
                     ideal_hit_rate=wl.ideal_hit_rate_token_weighted, replicas=replicas,
                     prefill_share=share, gpus_round_robin=rr.gpus, gpus_prefix_aware=pa.gpus,
                     best_policy=best_policy)
    return EstimateResult(
        model=model, gpu=gpu, dtype=o.dtype, kv_dtype=kv_dtype, mfu=o.mfu, linear=o.linear, replicas=replicas,
        tensor_parallel=tp, usd_per_gpu_hour=price, hours_per_month=o.hours_per_month, workload=wl,
        per_gpu_prefill_tokens_s=F.effective_flops(gpu, o.dtype, o.mfu) / (2 * model.active_params),
        scenarios=scenarios, policies=policies,
        monthly_gpu_hours_saved=saved_gpus * o.hours_per_month,
        monthly_savings_usd=saved_gpus * o.hours_per_month * price,
        monthly_savings_vs_no_reuse_usd=(scenarios[0].gpus - pa.gpus) * o.hours_per_month * price,
        ttft_hit_s=hit_s, ttft_miss_s=miss_s, ttft_idle_hit_s=idle_hit_s, ttft_idle_miss_s=idle_miss_s,
        kv_bytes_per_token=model.kv_bytes_per_token(kvbytes), kv_capacity_tokens_per_replica=kv_cap,
        prefill_share=share, sensitivity=_sensitivity(calc, rr, pa_h, o.mfu, price), verdict=verdict,
        notes=tuple(notes),
    )


def _policy_scenarios(calc: _Calc, m: MeasuredWorkload | None) -> tuple[Scenario, ...]:
    if m is None:
        return ()
    out = []
    for p in m.policies:
        s = calc.scenario(p.policy, calc.from_token_weighted(p.hit_rate_token_weighted), "simulated")
        out.append(dataclasses.replace(s, ttft_p50_s=p.ttft_p50_s, ttft_p95_s=p.ttft_p95_s))
    return tuple(out)


def _prefix_aware_hit(o: EstimateOptions, calc: _Calc, m: MeasuredWorkload | None,
                      policies: tuple[Scenario, ...], kv_cap: int, notes: list[str]
                      ) -> tuple[float, str, str | None]:
    """Hit probability for the prefix-aware scenario: flag > best simulated policy > LRU curve > ideal.

    Only adoptable policies compete for "best": baselines and the oracle upper bound are priced but skipped.
    """
    best = max((p for p in policies if adoptable(p.name)), key=lambda s: s.hit_rate, default=None)
    best_name = best.name if best is not None else None
    if o.hit_rate is not None:
        return o.hit_rate, "--hit-rate", best_name
    if o.token_hit_rate is not None:
        return calc.from_token_weighted(o.token_hit_rate), "--token-hit-rate", best_name
    if m is None:
        raise UsageError("without a run directory pass --hit-rate (share of requests whose prefix is cached)")
    if best is not None:
        return best.hit_rate, f"best simulated policy {best.name}", best.name
    lru = m.lru_hit_rate_at(kv_cap)
    if lru is not None:
        return (calc.from_token_weighted(lru),
                f"LRU hit rate at one replica's KV capacity ({kv_cap:,} tokens)", None)
    notes.append("no simulation or capacity curve in the run: prefix-aware uses the ideal (infinite cache) "
                 "hit rate, an upper bound; run `prefixscan simulate` for a realistic one")
    return 1.0, "ideal cache (upper bound: no simulation in the run)", None


def _sensitivity(calc: _Calc, rr: Scenario, h: float, mfu: float, price: float) -> tuple[SensitivityRow, ...]:
    """Prefix-aware GPUs and monthly savings when one assumption moves and the others stay put."""
    rows: list[SensitivityRow] = []

    def add(param: str, value: float, **kw: float) -> None:
        pa = calc.scenario("prefix_aware", kw.get("h", h), mfu=kw.get("mfu"), price=kw.get("price"))
        base = rr if "mfu" not in kw and "price" not in kw else calc.scenario(
            "round_robin", rr.hit_rate, mfu=kw.get("mfu"), price=kw.get("price"))
        rows.append(SensitivityRow(param, value, pa.gpus, base.usd_per_month - pa.usd_per_month))

    for v in sorted({round(min(1.0, max(0.0, h + d)), 4) for d in (-0.2, -0.1, 0.0, 0.1)}):
        add("hit_rate", v, h=v)
    for v in sorted({round(min(1.0, mfu * f), 4) for f in (0.6, 0.8, 1.0, 1.2)}):
        add("mfu", v, mfu=v)
    for v in sorted({round(price * f, 4) for f in (0.6, 1.0, 1.4)}):
        add("usd_per_gpu_hour", v, price=v)
    return tuple(rows)
