"""`estimate`: prefill GPUs and dollars under no reuse, the status quo, prefix-aware routing and an ideal cache.

A request has `context` prompt tokens of which the last `new` can never be cached (the new turn). On a
hit it prefills only `new` (reusing context - new); on a miss it prefills all `context`. With hit
probability h, prefill tokens/s = rps * (h*new + (1-h)*context) (seed 000). From flags alone round
robin is analytic, h = 1/replicas; on a run, round robin and the router are replayed by the simulator
at the scenario (prefixscan.cost.replay), and measured token-weighted hit rates H convert with
h = H * context / (context - new). When the log has the engine's own cached tokens, they are the status
quo ("today"). GPUs = prefill FLOP/s / (peak dense FLOP/s x MFU).
"""

from __future__ import annotations

import dataclasses
import os

from prefixscan.cost.measure import MeasuredWorkload, measure_run
from prefixscan.cost.options import EstimateOptions
from prefixscan.cost.replay import Baselines, PolicyHit, baselines, replay
from prefixscan.cost.result import EstimateResult, Scenario, SensitivityRow, Workload
from prefixscan.cost.scenario import BUSY, MEASURED, ScenarioSpec, resolve_scenario
from prefixscan.cost.status_quo import StatusQuo, explain, sweep_counts
from prefixscan.cost.verdict import VerdictInputs, decide
from prefixscan.errors import UsageError
from prefixscan.hardware import flops as F

__all__ = ["EstimateOptions", "EstimateResult", "Scenario", "SensitivityRow", "Workload", "estimate"]


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
    if o.mfu is not None and not 0 < o.mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], got {o.mfu}")
    if o.kv_blocks is not None and o.kv_blocks < 1:
        raise UsageError(f"--kv-blocks must be >= 1, got {o.kv_blocks}")
    if o.gpu_memory_utilization is not None and not 0 < o.gpu_memory_utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {o.gpu_memory_utilization}")
    if o.hit_rate is not None and o.token_hit_rate is not None:
        raise UsageError("pass either --hit-rate (share of requests that hit) or --token-hit-rate, not both")


def _workload(o: EstimateOptions, m: MeasuredWorkload | None, spec: ScenarioSpec, source: str) -> Workload:
    rps = spec.rps
    context = o.context_tokens or (m.context_tokens if m else None)
    new = o.new_tokens if o.new_tokens is not None else (m.new_tokens if m else None)
    given = [("--rps", rps), ("--context-tokens", context), ("--new-tokens", new)]
    missing = [f for f, v in given if v is None]
    if missing:
        raise UsageError(f"without a run directory pass {', '.join(missing)} (or give RUN_DIR)")
    assert rps is not None and context is not None and new is not None  # for the type checker: `missing` is empty
    if rps != rps:  # NaN: all arrivals at one instant, or only isolated instants between idle gaps
        why = m.rate_note if m is not None and m.gappy else "all requests share one arrival time"
        raise UsageError(f"cannot measure a request rate: {why}; pass --rps (the traffic's requests per second)")
    if context <= 0:
        raise UsageError(f"mean context is {context:g} tokens; nothing to prefill (check the requests table)")
    if new > context:
        raise UsageError(f"--new-tokens ({new:g}) cannot exceed --context-tokens ({context:g})")
    output = o.output_tokens if o.output_tokens is not None else (m.output_tokens if m else None)
    return Workload(rps=float(rps), context_tokens=float(context), new_tokens=float(new),
                    output_tokens=output, source=source, measured_rps=m.rps if m else None,
                    requests=m.requests if m else None,
                    ideal_hit_rate_token_weighted=m.ideal_hit_rate_token_weighted if m else None)


_ANALYTIC = ("no run to replay: round robin is a 1/{n} hit chance, which assumes each request's prefix is "
             "cached on one replica only (a prefix many requests share is usually warm on all of them; give a "
             "run directory to replay it)")


class _Calc:
    """The arithmetic shared by scenarios and the sensitivity table."""

    def __init__(self, wl: Workload, spec: ScenarioSpec, linear: bool, hours: float) -> None:
        self.wl, self.spec, self.linear, self.hours = wl, spec, linear, hours
        c, n = wl.context_tokens, wl.new_tokens
        self.hit_flops = F.prefill_flops(n, c - n, spec.model, linear)
        self.miss_flops = F.prefill_flops(c, 0, spec.model, linear)

    def capture(self, big_h: float) -> float:
        """Token-weighted hit rate -> the seed's h (share of the ideal cache's hits)."""
        r = self.wl.reusable_fraction
        return 0.0 if r <= 0 else min(1.0, max(0.0, big_h / r))

    def scenario(self, name: str, h: float, share: float | None, source: str = "", basis: str = "",
                 mfu: float | None = None, price: float | None = None) -> Scenario:
        """Price capture-of-ideal h; `share` is the per-request hit share shown beside it."""
        wl, spec = self.wl, self.spec
        tokens = wl.rps * (h * wl.new_tokens + (1 - h) * wl.context_tokens)
        flops_s = wl.rps * (h * self.hit_flops + (1 - h) * self.miss_flops)
        gpus = flops_s / F.effective_flops(spec.gpu, spec.dtype, mfu or spec.mfu)
        usd = gpus * self.hours * (spec.gpu.usd_per_hour if price is None else price)
        return Scenario(name, share, h * wl.reusable_fraction, h, tokens, flops_s, gpus, usd, source, basis)

    def replayed(self, name: str, p: PolicyHit, basis: str, source: str) -> Scenario:
        s = self.scenario(name, self.capture(p.hit_rate_token_weighted), p.hit_share_requests, source, basis)
        return dataclasses.replace(s, hit_rate_token_weighted=p.hit_rate_token_weighted, ttft_p50_s=p.ttft_p50_s,
                                   ttft_p95_s=p.ttft_p95_s)


def _round_robin(calc: _Calc, base: Baselines, replicas: int) -> Scenario:
    rr = base.round_robin
    if rr is not None:
        return calc.replayed("round_robin", rr, base.basis, f"round_robin, {base.basis}")
    return calc.scenario("round_robin", 1.0 / replicas, 1.0 / replicas,
                         f"analytic: hit chance 1/{replicas} (each request's prefix warm on one replica only)",
                         "analytic")


def _prefix_aware(o: EstimateOptions, calc: _Calc, base: Baselines, m: MeasuredWorkload | None
                  ) -> tuple[Scenario, str | None]:
    """Flag > best replayed router > (no run) an error; a run that cannot be replayed gets the ideal bound."""
    best = base.router
    name = best.policy if best is not None else None
    if o.hit_rate is not None:
        return calc.scenario("prefix_aware", o.hit_rate, o.hit_rate, "--hit-rate", "flags"), name
    if o.token_hit_rate is not None:
        return calc.scenario("prefix_aware", calc.capture(o.token_hit_rate), None, "--token-hit-rate",
                             "flags"), name
    if m is None:
        raise UsageError("without a run directory pass --hit-rate (share of requests whose prefix is cached)")
    if best is not None:
        return calc.replayed("prefix_aware", best, base.basis, f"{best.policy}, {base.basis}"), name
    share = m.ideal_hit_requests / m.requests
    return calc.scenario("prefix_aware", 1.0, share, "ideal cache (upper bound: the run cannot be replayed)",
                         "measured"), None


def _engine_status(run_dir: str | os.PathLike[str], m: MeasuredWorkload, spec: ScenarioSpec,
                   rr: Scenario, base: Baselines) -> StatusQuo | None:
    """The engine-reported status quo, with extra round-robin replays that explain the gap."""
    e = m.engine
    if e is None:
        return None
    today, rr_h = e.hit_rate_token_weighted, (rr.hit_rate_token_weighted if base.round_robin else None)
    sweep: tuple[tuple[int, float], ...] = ()
    unbounded = None
    if rr_h is not None and today > rr_h + 0.02:
        counts = sweep_counts(spec.replicas)
        sweep = tuple((k, replay(run_dir, spec, m, ("round_robin",), replicas=k)[0].hit_rate_token_weighted)
                      for k in counts)
    if rr_h is not None and abs(today - rr_h) > 0.02:
        unbounded = replay(run_dir, spec, m, ("round_robin",), unbounded_kv=True,
                           kv_blocks=None)[0].hit_rate_token_weighted
    text = explain(e, m.requests, rr_h, spec.replicas, spec.kv_tokens_per_replica, sweep, unbounded)
    share = None if e.hit_requests is None else e.hit_requests / e.requests
    return StatusQuo(e.requests, m.requests, today, share, rr_h, spec.replicas, sweep, unbounded,
                     e.above_ideal_requests, text, e.source)


def _prefill_share(wl: Workload, spec: ScenarioSpec, o: EstimateOptions, status_gpus: float) -> float | None:
    if wl.output_tokens is None:
        return None
    mean_kv = wl.context_tokens + wl.output_tokens / 2  # KV read per step, averaged over the output
    per_tok = F.decode_gpu_seconds_per_token(spec.model, spec.gpu, spec.dtype, mean_kv,
                                             F.dtype_bytes(spec.kv_dtype), o.decode_batch, spec.mfu)
    decode_gpus = wl.rps * wl.output_tokens * per_tok
    return status_gpus / (status_gpus + decode_gpus) if status_gpus + decode_gpus > 0 else None


def _ttft(o: EstimateOptions, wl: Workload, spec: ScenarioSpec, gpus: float) -> tuple[float, float]:
    c, n, args = wl.context_tokens, wl.new_tokens, (spec.model, spec.gpu, spec.dtype, spec.mfu, o.linear, gpus)
    return (o.ttft_overhead_s + F.prefill_seconds(n, c - n, *args),
            o.ttft_overhead_s + F.prefill_seconds(c, 0, *args))


def estimate(options: EstimateOptions, run_dir: str | os.PathLike[str] | None = None) -> EstimateResult:
    """Prefill GPUs, dollars, TTFT and a verdict, from flags alone or from a run directory."""
    o = options
    _validate(o)
    m = measure_run(run_dir) if run_dir is not None else None
    spec = resolve_scenario(o, m)
    wl = _workload(o, m, spec, str(run_dir) if run_dir is not None else "flags")
    calc = _Calc(wl, spec, o.linear, o.hours_per_month)
    base = (baselines(run_dir, m, spec, tuple(o.policies)) if m is not None and run_dir is not None else
            Baselines("analytic", _ANALYTIC.format(n=spec.replicas), ()))
    rr = _round_robin(calc, base, spec.replicas)
    pa, best_policy = _prefix_aware(o, calc, base, m)
    engine = _engine_status(run_dir, m, spec, rr, base) if m is not None and run_dir is not None else None
    today = None
    if engine is not None:
        where = "the engine's prefix-cache counters" if engine.source == "counters" else \
            "engine-reported cached tokens in the log"
        today = calc.scenario("today", calc.capture(engine.hit_rate_token_weighted), engine.hit_share_requests,
                              where, "engine-reported")
        today = dataclasses.replace(today, hit_rate_token_weighted=engine.hit_rate_token_weighted)
    ideal_share = m.ideal_hit_requests / m.requests if m is not None else 1.0
    no_reuse = calc.scenario("no_reuse", 0.0, 0.0, "every prompt prefilled in full", "model")
    ideal = calc.scenario("ideal", 1.0, ideal_share, "every request reuses all but its new tokens",
                          "measured" if m is not None else "model")
    scenarios = (no_reuse, *((today,) if today else ()), rr, pa, ideal)
    status = today or rr
    price, hours = spec.gpu.usd_per_hour, o.hours_per_month
    share = _prefill_share(wl, spec, o, status.gpus)
    verdict = decide(_verdict_inputs(m, spec, base, wl, status, rr, pa, share, best_policy))
    hit_s, miss_s = _ttft(o, wl, spec, o.ttft_gpus)
    idle_hit_s, idle_miss_s = _ttft(o, wl, spec, float(spec.tensor_parallel))
    policies = tuple(calc.replayed(p.policy, p, base.basis, base.basis) for p in base.policies)
    return EstimateResult(
        spec=spec, linear=o.linear, hours_per_month=hours, workload=wl,
        per_gpu_prefill_tokens_s=F.effective_flops(spec.gpu, spec.dtype, spec.mfu) / (2 * spec.model.active_params),
        baseline_basis=base.basis, baseline_detail=base.detail, scenarios=scenarios, status_quo=status.name,
        policies=policies, policy_rows=tuple(p.row for p in base.policies), engine=engine,
        monthly_gpu_hours_saved=(status.gpus - pa.gpus) * hours,
        monthly_savings_usd=(status.gpus - pa.gpus) * hours * price,
        monthly_savings_vs_round_robin_usd=(rr.gpus - pa.gpus) * hours * price,
        monthly_savings_vs_no_reuse_usd=(no_reuse.gpus - pa.gpus) * hours * price,
        ttft_hit_s=hit_s, ttft_miss_s=miss_s, ttft_idle_hit_s=idle_hit_s, ttft_idle_miss_s=idle_miss_s,
        kv_bytes_per_token=spec.model.kv_bytes_per_token(F.dtype_bytes(spec.kv_dtype)),
        prefill_share=share, sensitivity=_sensitivity(calc, status, pa.capture_of_ideal, spec.mfu, price),
        verdict=verdict, notes=tuple(_notes(o, m, spec, base) + (_overload(spec, status) if base.policies
                                                                    else [])),
    )


def _verdict_inputs(m: MeasuredWorkload | None, spec: ScenarioSpec, base: Baselines, wl: Workload,
                    status: Scenario, rr: Scenario, pa: Scenario, share: float | None,
                    best_policy: str | None) -> VerdictInputs:
    router = base.router if pa.basis != "flags" else None
    return VerdictInputs(
        repetition_measured=m is not None, ideal_hit_rate=wl.ideal_hit_rate_token_weighted,
        replicas=spec.replicas, basis=base.basis, rps=wl.rps, rate_from_sample=spec.rps_source == BUSY,
        status_quo="today (engine-reported)" if status.name == "today" else "round robin",
        status_quo_gpus=status.gpus, status_quo_hit=status.hit_rate_token_weighted,
        router=(router.policy if router else (f"prefix-aware routing ({pa.source})" if pa.basis == "flags"
                                              else "an ideal cache")),
        router_gpus=pa.gpus, router_hit=pa.hit_rate_token_weighted, round_robin_hit=rr.hit_rate_token_weighted,
        prefill_share=share, router_imbalance=router.imbalance_max_mean if router else None,
        router_ttft_p95_s=router.ttft_p95_s if router else None,
        round_robin_ttft_p95_s=base.round_robin.ttft_p95_s if router and base.round_robin else None,
        best_policy=best_policy)


def _notes(o: EstimateOptions, m: MeasuredWorkload | None, spec: ScenarioSpec, base: Baselines) -> list[str]:
    notes: list[str] = []
    if m is not None and base.basis == "analytic":
        notes.append(f"round robin is analytic (1/{spec.replicas}) because the run {base.detail[0].lower()}"
                     f"{base.detail[1:]}")
    if spec.kv_tokens_per_replica == 0:
        notes.append(f"the weights do not fit on {spec.tensor_parallel} x {spec.gpu.name} at this dtype; raise "
                     "--tensor-parallel")
    if m is not None and m.rate_note and spec.rps_source == BUSY:
        notes.append(m.rate_note)
    if m is not None and spec.rps is not None and spec.sources.get("rps") != MEASURED:
        busy = " over the log's busy periods" if m.gappy else ""
        notes.append(f"rate {spec.rps:g} req/s ({spec.rps_source}) against {m.rps:.3g} req/s measured{busy}; the "
                     "replay compresses the log's arrival times to that rate (same requests, closer together)")
    if m is not None and m.engine is not None:
        notes.append("savings are against what the engine reported (today), assumed to hold at this rate")
    return notes


def _overload(spec: ScenarioSpec, status: Scenario) -> list[str]:
    """The scenario's GPUs cannot even carry the status quo's prefill: replayed TTFTs are queueing."""
    have = spec.replicas * spec.tensor_parallel
    if status.gpus <= have:
        return []
    return [f"the {have} GPUs of this scenario ({spec.replicas} x TP{spec.tensor_parallel}) are fewer than the "
            f"{status.gpus:,.1f} prefill GPUs the status quo needs at {spec.rps:,.4g} req/s: the cluster is "
            "overloaded, so replayed TTFTs are mostly queueing; add replicas or lower the rate"]


def _sensitivity(calc: _Calc, status: Scenario, h: float, mfu: float, price: float) -> tuple[SensitivityRow, ...]:
    """Prefix-aware GPUs and monthly savings when one assumption moves and the others stay put."""
    rows: list[SensitivityRow] = []

    def add(param: str, value: float, **kw: float) -> None:
        pa = calc.scenario("prefix_aware", kw.get("h", h), None, mfu=kw.get("mfu"), price=kw.get("price"))
        base = status if "mfu" not in kw and "price" not in kw else calc.scenario(
            status.name, status.capture_of_ideal, None, mfu=kw.get("mfu"), price=kw.get("price"))
        rows.append(SensitivityRow(param, value, pa.gpus, base.usd_per_month - pa.usd_per_month))

    for v in sorted({round(min(1.0, max(0.0, h + d)), 4) for d in (-0.2, -0.1, 0.0, 0.1)}):
        add("capture_of_ideal", v, h=v)
    for v in sorted({round(min(1.0, mfu * f), 4) for f in (0.6, 0.8, 1.0, 1.2)}):
        add("mfu", v, mfu=v)
    for v in sorted({round(price * f, 4) for f in (0.6, 1.0, 1.4)}):
        add("usd_per_gpu_hour", v, price=v)
    return tuple(rows)
