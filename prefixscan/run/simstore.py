"""Named simulations side by side in one run directory, each replaced as one unit (docs/simulator.md,
"Named simulations").

Each simulation's tables live in `simulations/NAME@SEQ/`, indexed by the manifest's `simulations` section
(NAME -> {dir, tables, seq, config, workload, policies}; `seq` counts writes). A write, under the run's
lock: tables into a hidden temporary directory, renamed to a fresh `NAME@SEQ`, then the manifest switched
to it (one atomic file), then the old version removed. Readers only follow the manifest, so a simulate
killed at any point leaves exactly the old simulation or exactly the new one; the next one removes what
it left. A `default` of the older layout (tables at the top of the run) is still read and replaced.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa

from prefixscan.errors import PrefixscanError
from prefixscan.run.atomic import clean_temps, fsync_dir, is_temp_name, temp_path
from prefixscan.run.load import read_manifest
from prefixscan.run.modes import apply_mode
from prefixscan.run.rundir import extending, run_mode, write_manifest, write_table
from prefixscan.run.simindex import _DIR_RE, DEFAULT, SIM_DIR, TABLE_RE, check_name, index, table_dir


def save(run: str | os.PathLike[str], tables: dict[str, pa.Table], info: dict[str, Any], name: str) -> Path:
    """Store one simulation under `name`, replacing that name as one unit (see the module docstring);
    returns the directory of its tables."""
    check_name(name)
    for t in tables:
        if not TABLE_RE.fullmatch(t):
            raise ValueError(f"not a simulation table name: {t!r}")
    with extending(run) as (path, manifest):
        idx = index(manifest, path)
        sims = table_dir(path, f"{SIM_DIR}/{name}").parent
        sims.mkdir(exist_ok=True)
        clean_temps(sims)  # a killed simulate's half-written directory
        _remove_unlisted(sims, idx)
        seq = 1 + max((e.get("seq", 0) for e in idx.values()), default=0)
        rel = f"{SIM_DIR}/{name}@{seq}"
        where = path / rel
        tmp = temp_path(where, "new-")
        try:
            tmp.mkdir()
            for t, table in tables.items():
                write_table(tmp, t, table)
            fsync_dir(tmp)
            os.rename(tmp, where)
            fsync_dir(sims)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = idx.get(name)
        idx[name] = {"dir": rel, "seq": seq, "tables": {t: tb.num_rows for t, tb in tables.items()}, **info}
        manifest["simulations"] = idx
        if name == DEFAULT:  # the old top-level default's manifest entries: the index is their one home now
            manifest.pop("simulate", None)
            listed = manifest.get("tables")
            if isinstance(listed, dict):
                manifest["tables"] = {t: v for t, v in listed.items()
                                      if not (isinstance(v, dict) and v.get("stage") == "simulate")}
        try:
            write_manifest(path, manifest)  # the switch: from here on readers see the new simulation
        except BaseException:
            _unless_listed(path, rel)
            raise
        if old is not None:
            _remove_version(path, old)
    apply_mode(run, run_mode(run))
    return where


def _remove_version(run: Path, entry: dict[str, Any]) -> None:
    """Delete the files of a replaced simulation (a checked entry: its dir and table names are plain)."""
    if entry["dir"]:
        where = table_dir(run, entry["dir"])
        shutil.rmtree(where, ignore_errors=True)
        return
    for t in entry.get("tables", {}):  # the old layout's default: its tables at the top of the run
        (run / f"{t}.parquet").unlink(missing_ok=True)


def _unless_listed(run: Path, rel: str) -> None:
    """After a failed switch: remove the new directory unless the manifest on disk points at it after all
    (an interrupt that came just after the rename of the manifest)."""
    try:
        on_disk = index(read_manifest(run), run)
    except (OSError, PrefixscanError):
        return  # left for the next simulate's clean-up
    if not any(e["dir"] == rel for e in on_disk.values()):
        shutil.rmtree(run / rel, ignore_errors=True)


def _remove_unlisted(sims: Path, idx: dict[str, dict[str, Any]]) -> None:
    """Remove simulation directories no entry points at: left by a simulate killed after renaming its
    directory and before switching the manifest, or after the switch and before removing the old one."""
    listed = {e["dir"].partition("/")[2] for e in idx.values() if e["dir"]}
    for p in sorted(sims.iterdir()):
        if p.name in listed or is_temp_name(p.name) or p.is_symlink() or not p.is_dir():
            continue
        if _DIR_RE.fullmatch(f"{SIM_DIR}/{p.name}"):
            shutil.rmtree(p, ignore_errors=True)
