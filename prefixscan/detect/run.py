"""The one call `analyze` makes: finalise the ingest-fed detector into a FindingsResult."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from prefixscan.config import AnalyzeConfig
from prefixscan.detect import FindingsResult, finalize
from prefixscan.detect.counterfactual import Blocks
from prefixscan.detect.fieldpath import locate_fields
from prefixscan.detect.shown import guard_findings
from prefixscan.privacy import identity_hasher
from prefixscan.reuse.ideal import ideal_reuse, scope_salts


def run_findings(cfg: AnalyzeConfig, ing: Any, req: pl.DataFrame, blocks: Blocks,
                 requests: Path | None = None) -> FindingsResult | None:
    """Findings for an analysis, or None with --no-findings. `blocks`: every request's hashes, chunk by
    chunk in row order (`counterfactual.Blocks`); `requests`: the requests table (to name a finding's
    field in the record's own shape)."""
    if not cfg.findings:
        return None
    baseline = None
    if cfg.granularity == "token" and req.height and ing.detector is not None and ing.detector.fed:
        # The counterfactual is block-granular; compare it with a block-granular baseline.
        blocks = list(blocks)
        offsets, flat = _joined(blocks)
        baseline = ideal_reuse(offsets, flat, req["prompt_tokens"].to_numpy(), ing.block_size, ing.hit_rule,
                               scope_salts(req["tenant"].to_list()),
                               scope_salts(req["conversation_id"].to_list())).cached_tokens
    res = finalize(ing.detector, req, blocks, ing.block_size, ing.hit_rule, identity_hasher(cfg), baseline)
    locate_fields(res.findings, requests, ing.sources, ing.shapes, dict(cfg.fields))  # `system[0].text` char 146
    guard_findings(res.findings, req, cfg.snippet_k, cfg.include_text)  # example text only as privacy allows
    return res


def _joined(chunks: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive (local CSR offsets, hashes) chunks as one CSR pair."""
    if not chunks:
        return np.zeros(1, np.int64), np.zeros(0, np.uint64)
    offs, base = [np.zeros(1, np.int64)], 0
    for off, _ in chunks:
        offs.append(off[1:] + base)
        base += int(off[-1])
    return np.concatenate(offs), np.concatenate([f for _, f in chunks])
