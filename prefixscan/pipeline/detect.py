"""Detect stage: the findings (cache breakers the encode stage's detector collected, checked by a
counterfactual re-analysis) and the miss attribution, from the written requests table.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.aggregate import actual_rows, read_columns
from prefixscan.pipeline.encode import Ingested
from prefixscan.pipeline.write import OnDisk, RowGroups


def findings_input(path: Path, ing: Ingested) -> tuple[pl.DataFrame, Iterator[tuple[np.ndarray, np.ndarray]]]:
    """(requests frame, block hashes chunk by chunk) for findings. The counterfactual re-analysis reads
    every request's blocks, one row group at a time, only when the detector saw chat records; otherwise
    only the rows with an engine value are needed."""
    if ing.detector is not None and ing.detector.fed:
        req = read_columns(path, ["seq", "request_id", "tenant", "conversation_id", "user", "prompt_tokens",
                                  "cached_tokens", "actual_cached_tokens", "predicted_minus_actual"])
        from prefixscan.detect.attribution import table_chunks

        return req, table_chunks(str(path))  # one row group at a time
    return actual_rows(path), iter(())


def findings(cfg: AnalyzeConfig, ing: Ingested, req: pl.DataFrame, path: Path) -> Any:
    """The findings result (None with --no-findings)."""
    from prefixscan.detect.run import run_findings

    freq, blocks = findings_input(path, ing) if cfg.findings else (req, [])
    return run_findings(cfg, ing, freq, blocks, path)


def misses(ing: Ingested, cfg: AnalyzeConfig, path: Path, fres: Any, out: Path) -> tuple[OnDisk, dict[str, Any]]:
    """The miss attribution of the requests table at `path`: the misses table, written to `out` one row
    group at a time as it is computed (at a 10M-request trace's size it would be ~1.3 GB in memory), and
    its totals (the summary's `miss_attribution`)."""
    from prefixscan.detect.attribution import MISSES_SCHEMA, attribute_groups

    pc = ing.prompt_check
    groups, totals = attribute_groups(str(path), ing.block_size, ing.hit_rule,
                                      fres.findings if fres is not None else [],
                                      block_granular=cfg.granularity == "block",
                                      tokenizer_mismatch=bool(pc.compared and pc.differ > 0.1 * pc.compared))
    writer, rows = RowGroups(out, out.parent / "misses.parquet", MISSES_SCHEMA), 0
    try:
        for t in groups:
            writer.write(t, np.zeros(t.num_rows, np.int64))
            rows += t.num_rows
        writer.close()
    except BaseException:
        writer.abandon()
        raise
    return OnDisk(out, rows), totals.summary()
