"""Cache-breaker findings: dynamic fields, pattern-free spans, normalisation drift.

The engine's shortfall against the prediction is not a breaker: `attribution` splits it into routing,
eviction and unexplained (a tokenizer or template mismatch).

`Detector` is fed by ingest; `run.finalize` runs after the reuse analysis and returns a FindingsResult
(findings ranked by tokens lost, the counterfactual hit rate, and the tables for the run directory).
"""

from __future__ import annotations

# Light on purpose: an encode worker imports detect.content for the detector's per-content work, and a
# package init that pulled in the finalisation (polars, the counterfactual's numba kernels) slowed its start-up.
# `finalize` lives in detect/run.py, its one caller.
from prefixscan.detect.detector import Detector

__all__ = ["Detector"]
