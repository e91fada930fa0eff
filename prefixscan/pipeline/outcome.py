"""What decides an analysis' outcome once the pipeline has run, for the CLI and `prefixscan.analyze()` alike.

Two rules live here so that both callers get the same result: engine evidence (a `/metrics` scrape, KV
events) is attached to the run it belongs to, and a run that accepted no record is an error
(NothingAcceptedError, exit 3), not a success that measured nothing. The module is light (the pipeline is
imported when `analyze` runs), so a caller can check its options and start the encode workers first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from prefixscan.config import AnalyzeConfig
from prefixscan.errors import NothingAcceptedError, UsageError

if TYPE_CHECKING:
    from prefixscan.pipeline.run import AnalysisResult


def check_evidence(output: str | None, metrics: Sequence[str] = (), kv_events: str | None = None) -> None:
    """Evidence is saved in the run: refuse it (UsageError, exit 2) before any work when there is no run."""
    if (metrics or kv_events) and not output:
        raise UsageError("--metrics and --kv-events are saved in the run: give -o RUN_DIR")


def analyze(cfg: AnalyzeConfig, metrics: Sequence[str] = (), kv_events: str | None = None,
            progress: Callable[[int, int, int], None] | None = None) -> AnalysisResult:
    """Run the analysis, attach the engine's evidence to the run (`result.evidence`), and raise
    NothingAcceptedError when no record was accepted; the error's `result` is the run (its rejects)."""
    check_evidence(cfg.output, metrics, kv_events)
    from prefixscan.pipeline.run import run_analysis

    result = run_analysis(cfg, progress)
    from prefixscan.pipeline.summary import check_accepted  # after the run: its encode stage comes first
    if metrics or kv_events:
        from prefixscan.evidence.attach import attach_evidence

        assert cfg.output is not None  # check_evidence
        result.evidence = attach_evidence(cfg.output, list(metrics), kv_events)
    try:
        check_accepted(result.summary["requests"], result.run_dir)
    except NothingAcceptedError as exc:
        exc.result = result
        raise
    return result
