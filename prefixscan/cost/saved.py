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
from prefixscan.run.load import ESTIMATE_FILE

FORMAT = 1


def run_fingerprint(run_dir: str | os.PathLike[str]) -> str:
    """What the estimate read from the run: its inputs, analysis settings and the simulation it used (the
    selected one, prefixscan.run.simstore; its name is part of the basis only when it is not `default`)."""
    from prefixscan.run.load import load_run

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
    from prefixscan.run.atomic import write_text
    from prefixscan.run.rundir import extending

    with extending(run):  # under the run's lock, written whole (temporary name, then rename)
        return write_text(run / ESTIMATE_FILE, text)


def is_stale(doc: dict[str, Any], run_dir: str | os.PathLike[str]) -> bool:
    """True when the run changed (re-analysed, re-simulated) after the estimate was saved."""
    return doc.get("run_fingerprint") != run_fingerprint(run_dir)


# Saved scenario keys by EstimateOptions field (prefixscan.cost.scenario.FIELDS).
_SAVED_KEY = {"kv_blocks": "kv_blocks_per_replica"}
_HARDWARE = ("model", "gpu", "dtype", "kv_dtype", "gpu_memory_utilization", "tensor_parallel")


def _carried(scenario: dict[str, Any], overridden: set[str]) -> dict[str, Any]:
    """The saved scenario's values a later command keeps unless it overrides them: the ones the user chose
    (a flag, prefixscan.toml, or an earlier saved estimate). An estimate.json written before sources were
    recorded keeps everything but a measured rate, and drops what derives from hardware that is overridden."""
    from prefixscan.cost.scenario import CONFIG, FIELDS, FLAG, SAVED

    values = {f: scenario.get(_SAVED_KEY.get(f, f)) for f in FIELDS}
    sources = scenario.get("sources")
    if isinstance(sources, dict):
        return {f: v for f, v in values.items() if v is not None and sources.get(f) in (FLAG, SAVED, CONFIG)}
    rate_src = scenario.get("rps_source")
    if rate_src not in ("--rps", "--scale-to-rps"):
        values.pop("rps")
    if overridden & set(_HARDWARE):
        values.pop("kv_blocks")
        if overridden & {"model", "gpu", "dtype"}:
            values.pop("tensor_parallel")
    if "gpu" in overridden:
        values.pop("usd_per_gpu_hour")
    return {f: v for f, v in values.items() if v is not None}


def merge_options(scenario: dict[str, Any] | None, options: Any | None) -> Any:
    """EstimateOptions for a later command on the run: each scenario option given now (a flag, or
    prefixscan.toml) overrides the saved estimate's value field by field; the rest come from the saved
    estimate (`scenario`, its "scenario" dict). Precedence per field: flag > saved estimate > prefixscan.toml
    > the saved simulation, measured or default (prefixscan.cost.scenario.resolve_scenario). A saved value that
    itself came from prefixscan.toml yields to the file's current value."""
    import dataclasses

    from prefixscan.cost.options import EstimateOptions
    from prefixscan.cost.scenario import CONFIG, FIELDS, FLAG, SAVED

    o = options if options is not None else EstimateOptions()
    if o.scale_to_rps and not o.rps:  # the old name of --rps
        o = dataclasses.replace(o, rps=o.scale_to_rps, scale_to_rps=None,
                                sources={**o.sources, "rps": o.sources.get("scale_to_rps", FLAG)})
    given = {f: getattr(o, f) for f in FIELDS if getattr(o, f) is not None}
    flags = {f for f in given if o.sources.get(f, FLAG) == FLAG}
    saved_src = (scenario or {}).get("sources") or {}
    merged, sources = dict(given), {f: o.sources[f] for f in given if f in o.sources}
    for f, v in _carried(scenario or {}, set(given)).items():
        if f in flags or (f in given and saved_src.get(f) == CONFIG):
            continue  # a flag wins; so does the file's current value over a value the file gave before
        merged[f], sources[f] = v, SAVED
    if "model" in merged and o.model_config and "model" not in flags:
        merged.pop("model")  # a --model-config model is named by its file, never by a catalogue name
    return dataclasses.replace(o, **{f: merged.get(f) for f in FIELDS}, sources=sources)


def same_scenario(scenario: dict[str, Any], options: Any) -> bool:
    """True when `options` change none of the saved scenario's values (the saved result can be reused)."""
    from prefixscan.cost.scenario import FIELDS

    return all(getattr(options, f) is None or getattr(options, f) == scenario.get(_SAVED_KEY.get(f, f))
               for f in FIELDS)


def load_estimate(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The saved estimate document ({"command_line", "result", ...}), or None when the run has none (read
    and checked by prefixscan.run.load, whose `Run.estimate` is the typed form)."""
    from prefixscan.run.load import read_estimate

    saved = read_estimate(run_dir)
    return None if saved is None else saved.document


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
