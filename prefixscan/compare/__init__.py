"""Runs judged and compared: CI gates over one run (`check`) and a before/after view of two (`diff`).

Both read only what `analyze` (and optionally `findings`, `simulate`) wrote into run directories, so they
cost nothing to re-run and never see customer text.
"""

from prefixscan.compare.check import CheckResult, Gate, check_run, severity
from prefixscan.compare.diff import DiffResult, diff_runs

__all__ = ["CheckResult", "DiffResult", "Gate", "check_run", "diff_runs", "severity"]
