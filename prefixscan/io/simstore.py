"""Named simulations side by side in one run directory.

`simulate --name NAME` keeps each simulation instead of replacing the last one. Layout:
- the simulation named `default` (what `simulate` writes without --name) stays where every reader has
  always found it: `sim_*.parquet` at the top of the run and the manifest's `simulate` section;
- any other NAME goes to `simulations/NAME/sim_*.parquet`;
- the manifest's `simulations` section indexes them all: NAME -> {dir, tables, seq, config, workload,
  policies}; `seq` counts writes, so "the most recent" is well defined.

Readers choose one (`load_run(path, simulation=NAME)`, or `using_simulation(NAME)` around a call that opens
the run itself, as report and estimate do): NAME when given (an unknown name is an error listing the
known ones), else `default` when stored, else the most recently written. Re-running a name replaces that
simulation only: each table atomically, under the run's lock, the manifest last, then the files of the
earlier version that the new one did not write are removed.
"""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from prefixscan.errors import UsageError

DEFAULT = "default"
SIM_DIR = "simulations"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_selected: contextvars.ContextVar[str | None] = contextvars.ContextVar("prefixscan_simulation", default=None)


def check_name(name: str) -> str:
    """A simulation name: letters, digits, `_`, `-`, `.`, 1-64 characters, not starting with a symbol."""
    if not NAME_RE.fullmatch(name or "") or name in (".", ".."):
        raise UsageError(f"--name {name!r}: use 1-64 letters, digits, '_', '-' or '.', starting with a letter "
                         "or digit")
    return name


def index(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every stored simulation by name (a run written before named simulations: its one as `default`)."""
    idx = manifest.get("simulations")
    out = dict(idx) if isinstance(idx, dict) else {}
    if DEFAULT not in out and isinstance(manifest.get("simulate"), dict):
        out[DEFAULT] = {"dir": "", "seq": 0, **manifest["simulate"]}
    return out


def names(manifest: dict[str, Any]) -> list[str]:
    """Stored simulation names, oldest write first."""
    idx = index(manifest)
    return sorted(idx, key=lambda n: (int(idx[n].get("seq", 0)), n))


def resolve(manifest: dict[str, Any], name: str | None, run: str | os.PathLike[str] = "") -> str | None:
    """The simulation a reader uses: `name`, else `default`, else the most recent; None when none is stored."""
    name = name if name is not None else _selected.get()
    known = names(manifest)
    if name is not None:
        if name not in known:
            listed = ", ".join(known) if known else "none (run `prefixscan simulate RUN_DIR` first)"
            raise UsageError(f"run {run} has no simulation named {name!r}; simulations: {listed}")
        return name
    if DEFAULT in known:
        return DEFAULT
    return known[-1] if known else None


def selected_view(manifest: dict[str, Any], name: str | None, run: str | os.PathLike[str] = ""
                  ) -> tuple[dict[str, Any], str, str | None]:
    """(manifest with `simulate` = the chosen simulation's section, its table directory, its name)."""
    chosen = resolve(manifest, name, run)
    if chosen is None or chosen == DEFAULT:
        return manifest, "", chosen
    entry = index(manifest)[chosen]
    view = dict(manifest)
    view["simulate"] = {k: entry[k] for k in ("config", "workload", "policies") if k in entry}
    return view, str(entry.get("dir", "")), chosen


@contextmanager
def using_simulation(name: str | None) -> Iterator[None]:
    """Within the block, runs opened without an explicit simulation use `name` (report, estimate)."""
    token = _selected.set(name)
    try:
        yield
    finally:
        _selected.reset(token)


def save(run: str | os.PathLike[str], tables: dict[str, pa.Table], info: dict[str, Any], name: str) -> Path:
    """Store one simulation under `name` (see the module docstring); returns the directory of its tables."""
    from prefixscan.io.atomic import clean_temps
    from prefixscan.io.rundir import extending, write_manifest, write_table

    check_name(name)
    with extending(run) as (path, manifest):
        rel = "" if name == DEFAULT else f"{SIM_DIR}/{name}"
        where = path / rel if rel else path
        where.mkdir(parents=True, exist_ok=True)
        clean_temps(where)  # a killed writer's temporaries of this simulation (the run's own: extending)
        idx = index(manifest)
        before = set(idx.get(name, {}).get("tables", {}))
        for t, table in tables.items():
            write_table(where, t, table)
        seq = 1 + max((int(e.get("seq", 0)) for e in idx.values()), default=0)
        idx[name] = {"dir": rel, "seq": seq, "tables": {t: tb.num_rows for t, tb in tables.items()}, **info}
        manifest["simulations"] = idx
        if name == DEFAULT:
            listed = manifest.setdefault("tables", {})
            for t in before - set(tables):
                listed.pop(t, None)
            for t, table in tables.items():
                listed[t] = {"rows": table.num_rows, "stage": "simulate"}
            manifest["simulate"] = info
        write_manifest(path, manifest)
        for t in before - set(tables):  # stale tables of the version just replaced
            (where / f"{t}.parquet").unlink(missing_ok=True)
    from prefixscan.io.modes import apply_mode, run_mode

    apply_mode(run, run_mode(run))
    return where


def listing(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per stored simulation (oldest first): what `simulate RUN --list` prints."""
    idx = index(manifest)
    chosen = resolve(manifest, None)
    rows = []
    for n in names(manifest):
        e = idx[n]
        cfg, wl = e.get("config", {}), e.get("workload", {})
        rows.append({"name": n, "default": n == chosen, "dir": e.get("dir") or ".",
                     "policies": list(e.get("policies", {})), "replicas": cfg.get("replicas"),
                     "kv_blocks_per_replica": wl.get("kv_blocks_per_replica"), "requests": wl.get("requests"),
                     "tables": sorted(e.get("tables", {}))})
    return rows
