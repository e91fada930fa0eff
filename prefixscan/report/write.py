"""Write a run's report: build the ReportData once, then render Markdown (+ SVG figures) and HTML.

This is the one module that knows both the results model and its renderers, so neither imports the
other (`model` never imports `markdown`, `html` or `figures`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from prefixscan.errors import UsageError
from prefixscan.report import html, markdown
from prefixscan.report.assemble import build, figure_dir
from prefixscan.report.figures import render_all
from prefixscan.run.atomic import env_error, write_text
from prefixscan.run.load import Run
from prefixscan.run.rundir import extending


def scenario_options(**scenario: Any) -> Any | None:
    """EstimateOptions from the scenario keywords given (None values dropped); None when none is given."""
    from dataclasses import fields

    from prefixscan.cost.estimator import EstimateOptions

    given = {k: v for k, v in scenario.items() if v is not None}
    if not given:
        return None
    known = {f.name for f in fields(EstimateOptions)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise UsageError(f"unknown scenario option(s) {', '.join(unknown)}")
    return EstimateOptions(**given)


def write_report(
    run_dir: str | os.PathLike[str] | Run,
    output: str | os.PathLike[str] | None = None,
    formats: tuple[str, ...] = ("md", "html"),
    compare_to: str | os.PathLike[str] | None = None,
    simulation: str | None = None,
    **scenario: Any,
) -> dict[str, Path]:
    """Build the report data once and write report.md (+ report_figures/*.svg) and/or report.html.

    `scenario` takes `EstimateOptions` fields (replicas, rps, scale_to_rps, usd_per_gpu_hour, model, gpu,
    dtype, kv_blocks, ...); without any, the saved estimate.json is reused. Returns the written paths by
    kind ("md", "html", "figures"). Same run directory and options give byte-identical files. With
    `compare_to` (an earlier run, say before a template change) the report gains a before/after section.
    `run_dir` may be a `Run` (prefixscan.run.load), which brings the simulation it was opened with;
    `simulation` names the stored simulation to report (`simulate --name`; default: the Run's, else
    `default`, else the most recent).
    """
    unknown = set(formats) - {"md", "html"}
    if unknown:
        raise UsageError(f"--format must be md, html or both, got {', '.join(sorted(unknown))}")
    run = Run.open(run_dir, simulation)
    data = build(run, scenario_options(**scenario))
    if compare_to is not None:
        from prefixscan.compare.diff import diff_runs

        data.comparison = diff_runs(compare_to, run.path)
    figures = render_all(data)
    out = Path(output) if output is not None else Path(run_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise env_error(exc, out) from None
    # into the run itself: under its lock; every file is written whole (temporary name, then renamed)
    in_run = out.resolve() == Path(run_dir).resolve()
    with extending(run_dir) if in_run else contextlib.nullcontext():
        written: dict[str, Path] = {}
        if "md" in formats:
            fdir = figure_dir(out)
            fdir.mkdir(exist_ok=True)
            for f in figures.values():
                write_text(fdir / f"{f.name}.svg", f.svg)
            for stale in sorted(fdir.glob("*.svg")):
                if stale.stem not in figures:
                    stale.unlink()
            written["figures"] = fdir
            written["md"] = write_text(out / "report.md", markdown.render(data, figures, fdir.name))
        if "html" in formats:
            written["html"] = write_text(out / "report.html", html.render(data, figures))
    from prefixscan.run.modes import apply_mode
    from prefixscan.run.rundir import run_mode

    fig = written.get("figures")
    apply_mode(out, run_mode(run_dir), [*written.values(), *(fig.glob("*.svg") if fig else [])])
    return written
