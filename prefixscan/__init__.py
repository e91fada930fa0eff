"""prefixscan: measure prompt-prefix reuse in LLM request logs before you build a prefix-aware router.

Public API (each mirrors a CLI command): `analyze()`, `simulate()`, `estimate()`, `write_report()`, `check()`,
`diff()`, `export()`, `explain()`; `Run.open(path, simulation=NAME)` (or `load_run()`) opens a run directory
as a typed `Run`, which each of the functions that read a run also takes in place of its path.
"""

from __future__ import annotations

import os as _os
import sys as _sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the return types of the public API (imported lazily at run time: `import prefixscan` is cheap)
    from pathlib import Path

    from prefixscan.compare.check import CheckResult
    from prefixscan.compare.diff import DiffResult
    from prefixscan.cost.result import EstimateResult
    from prefixscan.pipeline.run import AnalysisResult
    from prefixscan.reuse.explain import Explanation
    from prefixscan.run.export import ExportResult
    from prefixscan.run.load import Run
    from prefixscan.sim import SimResult

if "polars" not in _sys.modules:
    # polars allocates through its own jemalloc, which by default keeps freed pages for 10 s: between the
    # stages of a long analysis that is hundreds of MB of RSS nobody uses. Purge them after 250 ms instead
    # (read once, when polars loads; a user's own setting wins). See prefixscan/memory.py.
    _os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:250,muzzy_decay_ms:0")

from prefixscan.version import __version__


def analyze(*inputs: str, output: str | None = None, metrics: Sequence[str] = (), kv_events: str | None = None,
            **options: Any) -> AnalysisResult:  # lazy import
    """Analyse logs; see `prefixscan.pipeline.run.run_analysis` (`options` are AnalyzeConfig fields). As the
    CLI does (prefixscan.pipeline.outcome): `metrics` (Prometheus scrapes) and `kv_events` (a recording) are
    compared with the run and saved in it (`result.evidence`; they need `output`), and a run that accepted
    nothing raises NothingAcceptedError (an InputError, exit 3 in the CLI) naming the reasons, its `result`
    attribute the run (with `output`, its directory keeps the rejects table)."""
    from prefixscan.config import AnalyzeConfig
    from prefixscan.pipeline.outcome import analyze as _analyze
    from prefixscan.pipeline.outcome import check_evidence

    cfg = AnalyzeConfig(inputs=tuple(inputs), output=output, **options)
    check_evidence(output, metrics, kv_events)
    from prefixscan.pipeline.early import start_encode_workers

    start_encode_workers(cfg)  # their start-up overlaps the pipeline's imports
    return _analyze(cfg, metrics, kv_events)


def simulate(run_dir: str, save: bool = True, name: str = "default", **options: Any) -> SimResult:
    """Replay a run through N replicas under routing policies; see `prefixscan.sim.simulate`.

    Options are `SimConfig` fields (replicas=8, policies=("round_robin", ...), kv_blocks=...), read by
    `SimConfig.from_options` as the CLI's are: `timing_profile="vllm-cpu-tiny-llama"` (a built-in name or a
    JSON file) fills in the profile's prefill coefficients and decode times unless given, `event_delay_s > 0`
    makes the router's knowledge "delayed" unless `knowledge` is given. With `save`, the sim tables are
    written into the run directory under `name` as `prefixscan simulate --name` does.
    """
    import contextlib

    from prefixscan.run.rundir import extending
    from prefixscan.sim import SimConfig
    from prefixscan.sim import simulate as _simulate

    with extending(run_dir) if save else contextlib.nullcontext():  # the run's lock from replay to store
        result = _simulate(run_dir, SimConfig.from_options(**options))
        if save:
            result.save(run_dir, name)
    return result


def estimate(run_dir: str | _os.PathLike[str] | None = None, save: bool = False, simulation: str | None = None,
             **options: Any) -> EstimateResult:
    """Prefill GPUs, dollars and a verdict; see `prefixscan.cost.estimator.estimate`. `simulation` names the
    stored simulation to reuse (`simulate --name`; default: `default`, else the most recent).

    With `save` (and a run directory) the result is written to RUN_DIR/estimate.json, as the CLI does,
    so `write_report` reuses its scenario.
    """
    from prefixscan.cost.estimator import EstimateOptions
    from prefixscan.cost.estimator import estimate as _estimate
    from prefixscan.run.load import Run as _Run

    run = _Run.open(run_dir, simulation) if run_dir is not None else None
    result = _estimate(EstimateOptions(**options), run_dir=run)
    if save and run is not None:
        from prefixscan.cost.saved import save_estimate

        save_estimate(result, run)
    return result


def write_report(run_dir: str, output: str | None = None, **options: Any) -> dict[str, Path]:
    """Write report.md and report.html for a run; see `prefixscan.report.write.write_report`
    (`simulation=NAME` reports that stored simulation).

    (Not named `report`: that is the subpackage of reporters.)
    """
    from prefixscan.report.write import write_report as _write

    return _write(run_dir, output, **options)


def check(run_dir: str, **gates: Any) -> CheckResult:
    """CI gates over a run (min_hit_rate=, max_breaker_tokens=, fail_on=); see `prefixscan.compare.check_run`."""
    from prefixscan.compare import check_run

    return check_run(run_dir, **gates)


def diff(run_a: str, run_b: str, **options: Any) -> DiffResult:
    """Run B against run A (hit rates, groups, breakers, prefill); see `prefixscan.compare.diff_runs`."""
    from prefixscan.compare import diff_runs

    return diff_runs(run_a, run_b, **options)


def export(run_dir: str, output: str, to: str = "mooncake", **options: Any) -> ExportResult:
    """Write a run as an anonymised Mooncake or bailian trace; see `prefixscan.run.export.export_trace`."""
    from prefixscan.run.export import export_trace

    return export_trace(run_dir, output, to, **options)


def explain(run_dir: str | _os.PathLike[str], request_id: str, include_text: bool = False) -> Explanation:
    """Why one request hit or missed, block by block; see `prefixscan.reuse.explain.explain`."""
    from prefixscan.reuse.explain import explain as _explain

    return _explain(run_dir, request_id, include_text)


def load_run(path: str | _os.PathLike[str], simulation: str | None = None) -> Run:
    """Open a run directory (its `sim_*` tables: the named simulation's): `Run.open(path, simulation)`."""
    from prefixscan.run.load import Run as _Run

    return _Run.open(path, simulation)


def __getattr__(name: str) -> Any:
    if name == "Run":  # imported on first use: pyarrow is not needed to import prefixscan
        from prefixscan.run.load import Run

        return Run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Run", "__version__", "analyze", "check", "diff", "estimate", "explain", "export", "load_run",
           "simulate", "write_report"]
