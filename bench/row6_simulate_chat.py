"""Row 6: `simulate` throughput, each policy, on row 1's chat log (16-token blocks), 16 replicas (>= 10k req/s).

Same method as row 5 (bench/row5_simulate.py) on row 1's run directory.
"""

from __future__ import annotations

from pathlib import Path

from common import OUT, RowResult
from row5_simulate import REPLICAS, simulate_row


def run_row(scale: str, repeats: int, lg: Path) -> RowResult:
    res = RowResult(6, f"`simulate`, each policy, row 1's chat log (16-token blocks), {REPLICAS} replicas",
                    "requests per second", ">= 10k requests/s per policy")
    return simulate_row(res, OUT / f"run-chat-{scale}", repeats, 10_000, lg, cli=True)
