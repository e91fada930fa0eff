"""The pilot stage of `analyze`: the router's decision log (`--decisions`), read before the long work, and
the `pilot` table with its summary section, built from the requests table when the log carries latency or
a decision log was given (docs/pilot.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefixscan.config import AnalyzeConfig
from prefixscan.read.sources import check_output

if TYPE_CHECKING:  # `decisions` runs before the encode stage: without --decisions it imports nothing heavy
    from prefixscan.read.decisions import DecisionLog


def decisions(cfg: AnalyzeConfig) -> DecisionLog | None:
    """The router's decision log of --decisions (never an output's target), read whole: it is one small row
    per request."""
    if not cfg.decisions:
        return None
    from prefixscan.read.decisions import read_decisions, sources

    if cfg.output:
        check_output(cfg.output, (cfg.decisions,), sources(cfg.decisions))
    return read_decisions(cfg.decisions, cfg.strict)


def add(requests_path: str | Path, block: int, log: DecisionLog | None, tables: dict[str, Any],
        summary: dict[str, Any], notes: list[str]) -> None:
    """The pilot table and summary section: when the log carries latency, or a decision log is given (its
    rejects join the run's rejects table, its notes the summary's)."""
    import pyarrow as pa

    from prefixscan.schema import REJECTS_SCHEMA

    if log is not None:
        from prefixscan.pilot.decisions import measure as measure_decisions

        tables["pilot"], summary["pilot"], more = measure_decisions(requests_path, block, log)
        notes += more
        if log.rejects:
            tables["rejects"] = pa.concat_tables([tables["rejects"],
                                                  pa.Table.from_pylist(log.rejects, schema=REJECTS_SCHEMA)])
    else:
        from prefixscan.pilot.latency import measure as measure_pilot

        pilot = measure_pilot(requests_path, block)  # only when the log carries latency
        if pilot is None:
            return
        tables["pilot"], summary["pilot"] = pilot
    _prediction(requests_path, block, tables, summary, notes)


def _prediction(requests_path: str | Path, block: int, tables: dict[str, Any], summary: dict[str, Any],
                notes: list[str]) -> None:
    """Prefixscan's prediction next to the engine's outcome (prefixscan.pilot.prediction), from the misses
    table the attribution just wrote: its rows join the pilot table, its section the pilot summary."""
    import pyarrow as pa

    from prefixscan.pilot.prediction import measure as measure_prediction

    misses = tables.get("misses")
    if misses is None or not (summary.get("miss_attribution") or {}).get("requests_with_actual"):
        summary["pilot"]["prediction"] = None
        return
    source = misses if isinstance(misses, pa.Table) else misses.path
    rows, section, more = measure_prediction(requests_path, source, block, summary["miss_attribution"])
    summary["pilot"]["prediction"] = section
    tables["pilot"] = pa.concat_tables([tables["pilot"], rows])
    notes += more
