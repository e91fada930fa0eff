"""`prefixscan estimate`: prefill GPUs and dollars saved by prefix-aware routing, from a run or from flags."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Collection
from typing import Any

import typer

from prefixscan.cli.choices import DTYPES, gpu_names, model_names
from prefixscan.cli.common import handle_errors, stdout_console
from prefixscan.cost.options import ROUTER_POLICIES  # a module without dependencies: the CLI stays light
from prefixscan.errors import UsageError

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_count(text: str | None, flag: str) -> float | None:
    """Parse 70e9, 70B, 70.6b, 989T: plain floats or a K/M/B/T/P suffix."""
    if text is None:
        return None
    s = text.strip().lower().replace("_", "").replace(",", "")
    mult = 1.0
    if s and s[-1] in _SUFFIX:
        s, mult = s[:-1], _SUFFIX[s[-1]]
    try:
        value = float(s) * mult
    except ValueError:
        raise UsageError(f"{flag}: cannot read {text!r} as a number (examples: 70e9, 70B, 989T)") from None
    if value <= 0:
        raise UsageError(f"{flag} must be > 0, got {text}")
    return value


RPS_HELP = ("The traffic's rate in requests (turns) per second. On a run the replay compresses the log's "
            "busy periods to it (default: the saved simulation's rate, else the log's own: its busy-period "
            "rate when it has idle gaps).")


def one_rate(rps: float | None, old: float | None, old_flag: str, config: Collection[str] = ()) -> float | None:
    """--rps, or its hidden old name (kept so existing scripts work). When both are set and differ, the one
    typed wins over the one prefixscan.toml filled in (`config`: names the file set); two typed, an error."""
    old_name = old_flag.strip("-").replace("-", "_")
    if rps is not None and old is not None and rps != old:
        if "rps" in config and old_name not in config:
            return old
        if old_name in config and "rps" not in config:
            return rps
        raise UsageError(f"--rps {rps:g} and {old_flag} {old:g} (its old name) disagree; pass --rps only")
    return rps if rps is not None else old


def rate_and_sources(values: dict[str, Any]) -> tuple[float | None, dict[str, str]]:
    """(the rate, the options prefixscan.toml filled) of a command with --rps and its hidden old name
    --scale-to-rps: one rate, labelled by whichever of the two supplied it (estimate, report)."""
    rps, old = values.get("rps"), values.get("scale_to_rps")
    sources = option_sources(SCENARIO_PARAMS, values)
    rate = one_rate(rps, old, "--scale-to-rps", sources)
    rate_src = sources.get("scale_to_rps") if rate == old else sources.get("rps")
    sources.pop("rps", None), sources.pop("scale_to_rps", None)
    if rate_src:
        sources["rps"] = rate_src
    return rate, sources


def option_sources(names: tuple[str, ...], values: dict[str, object]) -> dict[str, str]:
    """Which of these options were filled from prefixscan.toml rather than typed (EstimateOptions.sources):
    the config fills options the user left at their defaults, so click still reports them as defaults."""
    from prefixscan.cost.scenario import CONFIG

    ctx = _current_context()
    if ctx is None:
        return {}
    out = {}
    for name in names:
        src = ctx.get_parameter_source(name)
        if values.get(name) is not None and (src is None or src.name in ("DEFAULT", "DEFAULT_MAP")):
            out[name] = CONFIG
    return out


def _current_context() -> Any:
    """The running command's click context (typer may bundle its own click, with its own context stack)."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # a typer that uses the installed click
        from click import get_current_context  # type: ignore[no-redef]  # the same function, from click
    return get_current_context(silent=True)


SCENARIO_PARAMS = ("model", "model_config", "gpu", "usd_per_gpu_hour", "dtype", "kv_dtype", "mfu", "replicas",
                   "tensor_parallel", "gpu_memory_utilization", "kv_blocks", "rps", "scale_to_rps")


def register(app: typer.Typer) -> None:
    """Add the `estimate` command to the application."""

    @app.command("estimate")
    @handle_errors
    def estimate(
        run_dir: str | None = typer.Argument(None, help="Run directory from `prefixscan analyze`."),
        model: str | None = typer.Option(None, "--model", "-m", metavar="MODEL",
                                         help=f"Catalogue model: {model_names()} (aliases and HF ids accepted; "
                                              "default: the simulated model of the run, else llama-3.1-70b)."),
        model_config: str | None = typer.Option(None, "--model-config", help="Local HF config.json."),
        params: str | None = typer.Option(None, "--params", help="Total parameters, e.g. 70e9 or 70B."),
        active_params: str | None = typer.Option(None, "--active-params", help="Active parameters (MoE)."),
        gpu: str | None = typer.Option(None, "--gpu", metavar="GPU", help=f"GPU: {gpu_names()} (h100 = h100-sxm; "
                                       "default: the simulation's, else h100)."),
        gpu_flops: str | None = typer.Option(None, "--gpu-flops", help="Peak dense FLOP/s for --dtype."),
        gpu_memory_gb: float | None = typer.Option(None, "--gpu-memory-gb", help="HBM per GPU in GB."),
        usd_per_gpu_hour: float | None = typer.Option(None, "--usd-per-gpu-hour", help="Price per GPU-hour."),
        dtype: str | None = typer.Option(None, "--dtype", metavar="|".join(DTYPES), help="Weights/compute dtype "
                                         "(default: the simulation's, else bf16)."),
        kv_dtype: str | None = typer.Option(None, "--kv-dtype", metavar="|".join(DTYPES),
                                            help="KV-cache dtype (default: --dtype)."),
        mfu: float | None = typer.Option(None, "--mfu", help="Model FLOPs utilisation during prefill "
                                         "(default: the simulation's, else 0.5)."),
        linear: bool = typer.Option(False, "--linear", help="Drop the attention term (2 x params/token)."),
        replicas: int | None = typer.Option(None, "--replicas", help="Engine replicas serving the traffic."),
        tensor_parallel: int | None = typer.Option(None, "--tensor-parallel", "--tp",
                                                   help="GPUs per replica (default: fits weights)."),
        gpu_memory_utilization: float | None = typer.Option(
            None, "--gpu-memory-utilization", help="Share of HBM the engine may use (default 0.9, vLLM's)."),
        kv_blocks: int | None = typer.Option(None, "--kv-blocks",
                                             help="KV blocks per replica for the replay (default: from model, "
                                                  "GPU, TP and memory, or the simulation's)."),
        rps: float | None = typer.Option(None, "--rps", help=RPS_HELP),
        scale_to_rps: float | None = typer.Option(None, "--scale-to-rps", hidden=True,
                                                  help="Old name of --rps."),
        context_tokens: float | None = typer.Option(None, "--context-tokens", help="Mean prompt tokens."),
        new_tokens: float | None = typer.Option(None, "--new-tokens", help="Mean uncachable tokens/turn."),
        output_tokens: float | None = typer.Option(None, "--output-tokens", help="Mean output tokens."),
        hit_rate: float | None = typer.Option(None, "--hit-rate",
                                              help="Share of requests that hit (prefix-aware)."),
        token_hit_rate: float | None = typer.Option(None, "--token-hit-rate",
                                                    help="Token-weighted hit rate (prefix-aware)."),
        ttft_gpus: float = typer.Option(1.0, "--ttft-gpus",
                                        help="GPUs' worth of prefill one request gets under load."),
        ttft_overhead_s: float = typer.Option(0.03, "--ttft-overhead-s", help="Fixed TTFT overhead (s)."),
        decode_batch: int = typer.Option(64, "--decode-batch", help="Decode batch for the prefill share."),
        hours_per_month: float = typer.Option(730.0, "--hours-per-month", help="Hours in a month."),
        policies: str = typer.Option(",".join(ROUTER_POLICIES), "--policies",
                                     help="Router policies to replay when no saved simulation matches "
                                          "the scenario (comma-separated)."),
        simulation: str | None = typer.Option(
            None, "--simulation", metavar="NAME",
            help="Which stored simulation to reuse (`simulate --name`; default: 'default', else the most "
                 "recent; `simulate RUN_DIR --list` lists them)."),
        save: bool = typer.Option(True, "--save/--no-save",
                                  help="Write the result to RUN_DIR/estimate.json (read by `report`)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but what --json asks for."),
    ) -> None:
        """Prefill GPUs and $ under no reuse, the status quo, prefix-aware routing and an ideal cache.

        Give a run directory to measure traffic and replay round robin and the router on its requests
        (the saved simulation when it matches the scenario), or flags alone for an analytic what-if.
        """
        from prefixscan.cost.estimator import estimate as run_estimate
        from prefixscan.cost.options import EstimateOptions

        rps, sources = rate_and_sources(locals())
        options = EstimateOptions(
            model=model, model_config=model_config, params=parse_count(params, "--params"),
            active_params=parse_count(active_params, "--active-params"), gpu=gpu,
            gpu_flops=parse_count(gpu_flops, "--gpu-flops"), gpu_memory_gb=gpu_memory_gb,
            usd_per_gpu_hour=usd_per_gpu_hour, dtype=dtype, kv_dtype=kv_dtype, mfu=mfu, linear=linear,
            replicas=replicas, tensor_parallel=tensor_parallel, gpu_memory_utilization=gpu_memory_utilization,
            kv_blocks=kv_blocks, policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
            rps=rps, context_tokens=context_tokens, new_tokens=new_tokens,
            output_tokens=output_tokens, hit_rate=hit_rate, token_hit_rate=token_hit_rate,
            ttft_gpus=ttft_gpus,
            ttft_overhead_s=ttft_overhead_s, decode_batch=decode_batch, hours_per_month=hours_per_month,
            sources=sources,
        )
        run = None
        if run_dir is not None:
            from prefixscan.io.rundir import load_run

            run = load_run(run_dir, simulation)  # an unknown name: one line listing the stored ones
        elif simulation is not None:
            raise UsageError("--simulation needs a run directory")
        result = run_estimate(options, run)
        if run is not None and save:
            from prefixscan.cost.saved import save_estimate

            save_estimate(result, run, "prefixscan " + shlex.join(sys.argv[1:]))
        if as_json:
            typer.echo(json.dumps(result.to_json(), indent=2, sort_keys=True))
            return
        if quiet:
            return
        from prefixscan.report.estimate_terminal import render

        render(result, stdout_console())
