"""`prefixscan estimate`: prefill GPUs and dollars saved by prefix-aware routing, from a run or from flags."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import typer

from prefixscan.cli.choices import DTYPES, gpu_names, model_names
from prefixscan.cli.common import handle_errors, is_default, json_or_quiet, stdout_console
from prefixscan.cli.groups import config_fields, grouped, opt
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
    return {name: CONFIG for name in names if values.get(name) is not None and is_default(ctx, name)}


def _current_context() -> Any:
    """The running command's click context (typer may bundle its own click, with its own context stack)."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # a typer that uses the installed click
        from click import get_current_context  # type: ignore[no-redef]  # the same function, from click
    return get_current_context(silent=True)


SCENARIO_PARAMS = ("model", "model_config", "gpu", "usd_per_gpu_hour", "dtype", "kv_dtype", "mfu", "replicas",
                   "tensor_parallel", "gpu_memory_utilization", "kv_blocks", "rps", "scale_to_rps")
_FROM = "default: the saved estimate's (report), else"  # report starts from estimate.json; both then the run's


@dataclass(frozen=True)
class ScenarioOptions:
    """The serving scenario `estimate` prices and `report` shows (one EstimateOptions field each; --rps and
    its hidden old name are one rate, resolved by `rate_and_sources`)."""

    model: str | None = opt(None, "--model", "-m", metavar="MODEL",
                            help=f"Catalogue model: {model_names()} (aliases and HF ids accepted; {_FROM} the "
                                 "simulated model of the run, else llama-3.1-70b).")
    gpu: str | None = opt(None, "--gpu", metavar="GPU",
                          help=f"GPU: {gpu_names()} (h100 = h100-sxm; {_FROM} the simulation's, else h100).")
    dtype: str | None = opt(None, "--dtype", metavar="|".join(DTYPES),
                            help=f"Weights/compute dtype ({_FROM} the simulation's, else bf16).")
    replicas: int | None = opt(None, "--replicas", help="Engine replicas serving the traffic.")
    tensor_parallel: int | None = opt(None, "--tensor-parallel", "--tp",
                                      help="GPUs per replica (default: fits weights).")
    kv_blocks: int | None = opt(None, "--kv-blocks", help="KV blocks per replica for the replay (default: from model, "
                                                          "GPU, TP and memory, or the simulation's).")
    rps: float | None = opt(None, "--rps", help=RPS_HELP)
    scale_to_rps: float | None = opt(None, "--scale-to-rps", hidden=True, help="Old name of --rps.")
    usd_per_gpu_hour: float | None = opt(None, "--usd-per-gpu-hour", help="Price per GPU-hour.")
    mfu: float | None = opt(None, "--mfu", help=f"Model FLOPs utilisation during prefill ({_FROM} the simulation's, "
                                                "else 0.5).")

    def given(self, others: Any = None) -> tuple[dict[str, Any], dict[str, str]]:
        """(the EstimateOptions fields given, with the one rate as `rps`; which of them and of the `others`
        group's scenario options came from prefixscan.toml)."""
        rate, sources = rate_and_sources({**dataclasses.asdict(self), **(dataclasses.asdict(others) if others else {})})
        fields = {**config_fields(self, frozenset({"rps", "scale_to_rps"})), "rps": rate}
        return fields, sources


@dataclass(frozen=True)
class WhatIfOptions:
    """What `estimate` alone takes: a model or GPU outside the catalogue, the traffic of a what-if without a
    run, and the cost model's constants."""

    model_config: str | None = opt(None, "--model-config", help="Local HF config.json.")
    params: str | None = opt(None, "--params", convert=lambda t: parse_count(t, "--params"),
                             help="Total parameters, e.g. 70e9 or 70B.")
    active_params: str | None = opt(None, "--active-params", convert=lambda t: parse_count(t, "--active-params"),
                                    help="Active parameters (MoE).")
    gpu_flops: str | None = opt(None, "--gpu-flops", convert=lambda t: parse_count(t, "--gpu-flops"),
                                help="Peak dense FLOP/s for --dtype.")
    gpu_memory_gb: float | None = opt(None, "--gpu-memory-gb", help="HBM per GPU in GB.")
    kv_dtype: str | None = opt(None, "--kv-dtype", metavar="|".join(DTYPES), help="KV-cache dtype (default: --dtype).")
    linear: bool = opt(False, "--linear", help="Drop the attention term (2 x params/token).")
    gpu_memory_utilization: float | None = opt(None, "--gpu-memory-utilization",
                                               help="Share of HBM the engine may use (default 0.9, vLLM's).")
    context_tokens: float | None = opt(None, "--context-tokens", help="Mean prompt tokens.")
    new_tokens: float | None = opt(None, "--new-tokens", help="Mean uncachable tokens/turn.")
    output_tokens: float | None = opt(None, "--output-tokens", help="Mean output tokens.")
    hit_rate: float | None = opt(None, "--hit-rate", help="Share of requests that hit (prefix-aware).")
    token_hit_rate: float | None = opt(None, "--token-hit-rate", help="Token-weighted hit rate (prefix-aware).")
    ttft_gpus: float = opt(1.0, "--ttft-gpus", help="GPUs' worth of prefill one request gets under load.")
    ttft_overhead_s: float = opt(0.03, "--ttft-overhead-s", help="Fixed TTFT overhead (s).")
    decode_batch: int = opt(64, "--decode-batch", help="Decode batch for the prefill share.")
    hours_per_month: float = opt(730.0, "--hours-per-month", help="Hours in a month.")
    policies: str = opt(",".join(ROUTER_POLICIES), "--policies",
                        convert=lambda text: tuple(p.strip() for p in text.split(",") if p.strip()),
                        help="Router policies to replay when no saved simulation matches the scenario "
                             "(comma-separated).")


def simulation_option(verb: str) -> Any:
    """--simulation NAME: which stored simulation a command on a run uses (`verb`: what it does with it)."""
    return typer.Option(None, "--simulation", metavar="NAME",
                        help=f"Which stored simulation to {verb} (`simulate --name`; default: 'default', else the "
                             "most recent; `simulate RUN_DIR --list` lists them).")


def register(app: typer.Typer) -> None:
    """Add the `estimate` command to the application."""

    @app.command("estimate")
    @handle_errors
    @grouped
    def estimate(
        run_dir: str | None = typer.Argument(None, help="Run directory from `prefixscan analyze`."),
        scenario: ScenarioOptions = ...,  # type: ignore[assignment]  # each group: its options (cli/groups.py)
        what_if: WhatIfOptions = ...,  # type: ignore[assignment]
        simulation: str | None = simulation_option("reuse"),
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

        given, sources = scenario.given(what_if)
        options = EstimateOptions(**given, **config_fields(what_if), sources=sources)
        run = None
        if run_dir is not None:
            from prefixscan.run.load import Run

            run = Run.open(run_dir, simulation)  # an unknown name: one line listing the stored ones
        elif simulation is not None:
            raise UsageError("--simulation needs a run directory")
        result = run_estimate(options, run)
        if run is not None and save:
            from prefixscan.cost.saved import save_estimate

            save_estimate(result, run, "prefixscan " + shlex.join(sys.argv[1:]))
        if json_or_quiet(as_json, quiet, result.to_json(), sort_keys=True):
            return
        from prefixscan.report.estimate_terminal import render

        render(result, stdout_console())
