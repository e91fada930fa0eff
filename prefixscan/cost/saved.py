"""`estimate.json` in a run directory: the last estimate's scenario and result, so `report` reuses them.

Written atomically (temp file in the same directory, then rename) so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from prefixscan.cost.result import EstimateResult
from prefixscan.errors import RunDirError

FILE = "estimate.json"
FORMAT = 1


def run_fingerprint(run_dir: str | os.PathLike[str]) -> str:
    """What the estimate read from the run: its inputs, analysis settings and the simulation it used (the
    selected one, prefixscan.io.simstore; its name is part of the basis only when it is not `default`)."""
    from prefixscan.io.rundir import load_run

    run = load_run(run_dir)
    m = run.manifest
    basis = {k: m.get(k) for k in ("inputs", "config", "simulate")}
    if run.simulation not in (None, "default"):
        basis["simulation"] = run.simulation
    return hashlib.sha256(json.dumps(basis, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_estimate(result: EstimateResult, run_dir: str | os.PathLike[str], command_line: str = "") -> Path:
    """Write `estimate.json` (sorted keys, so the same estimate gives the same bytes)."""
    run = Path(run_dir)
    doc = {"format": FORMAT, "command_line": command_line, "run_fingerprint": run_fingerprint(run),
           "result": _finite(result.to_json())}
    text = json.dumps(doc, indent=2, sort_keys=True, default=_plain, allow_nan=False) + "\n"
    from prefixscan.io.atomic import write_text
    from prefixscan.io.rundir import extending

    with extending(run):  # under the run's lock, written whole (temporary name, then rename)
        return write_text(run / FILE, text)


def is_stale(doc: dict[str, Any], run_dir: str | os.PathLike[str]) -> bool:
    """True when the run changed (re-analysed, re-simulated) after the estimate was saved."""
    return doc.get("run_fingerprint") != run_fingerprint(run_dir)


def scenario_options(scenario: dict[str, Any]) -> Any:
    """EstimateOptions that re-run a saved estimate's scenario (catalogue model and GPU names)."""
    from prefixscan.cost.estimator import EstimateOptions

    source = scenario.get("rps_source")
    rate = {"rps": scenario["rps"]} if source == "--rps" else (
        {} if source == "measured" else {"scale_to_rps": scenario["rps"]})
    return EstimateOptions(
        model=scenario["model"], gpu=scenario["gpu"], dtype=scenario["dtype"], kv_dtype=scenario["kv_dtype"],
        tensor_parallel=scenario["tensor_parallel"], gpu_memory_utilization=scenario["gpu_memory_utilization"],
        replicas=scenario["replicas"], kv_blocks=scenario["kv_blocks_per_replica"],
        usd_per_gpu_hour=scenario["usd_per_gpu_hour"], mfu=scenario["mfu"], **rate)


def load_estimate(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The saved estimate document ({"command_line", "result", ...}), or None when the run has none."""
    path = Path(run_dir) / FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path} is unreadable ({exc}); re-run `prefixscan estimate {run_dir}`") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("result"), dict):
        raise RunDirError(f"{path} is not a saved estimate; re-run `prefixscan estimate {run_dir}`")
    return doc


def _finite(x: Any) -> Any:
    """NaN and infinities -> None, so the file is strict JSON."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _plain(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
