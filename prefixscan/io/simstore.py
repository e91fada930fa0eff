"""Named simulations side by side in one run directory, each replaced as one unit.

`simulate --name NAME` keeps each simulation instead of replacing the last one (no --name: `default`).
Layout: every simulation's tables live in a directory of their own, `simulations/NAME@SEQ/sim_*.parquet`,
and the manifest's `simulations` section indexes them: NAME -> {dir, tables, seq, config, workload,
policies}; `seq` counts writes, so "the most recent" is well defined and each write gets a fresh directory.

Re-running a name replaces that simulation only, as one unit, the way analyze replaces a run: under the
run's lock, the new tables are written into a hidden temporary directory, which is renamed to its fresh
`NAME@SEQ` name; then the manifest (one atomic file) is switched to point at it; then the old version's
directory is removed. Readers only follow the manifest, so a simulate killed or failing at any point
leaves exactly the old simulation or exactly the new one; what it left (a temporary directory, a directory
no entry points at) is removed by the next simulate.

Runs written by earlier versions are still read: a `default` simulation with `dir` "" (its tables at the
top of the run, its section in the manifest's `simulate`) and named ones in `simulations/NAME`.

Everything read from the manifest is checked before use (names, table names, directories inside
`simulations/`, value types); a damaged or crafted entry is a one-line RunDirError (exit 5).

Readers choose one (`load_run(path, simulation=NAME)`): NAME when given (an unknown name is an error
listing the known ones), else `default` when stored, else the most recently written.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa

from prefixscan.errors import PrefixscanError, RunDirError, UsageError
from prefixscan.io.atomic import clean_temps, fsync_dir, is_temp_name, temp_path
from prefixscan.io.rundir import extending, read_manifest, write_manifest, write_table

DEFAULT = "default"
SIM_DIR = "simulations"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TABLE_RE = re.compile(r"sim_[a-z0-9_]{1,60}")
_DIR_RE = re.compile(rf"{SIM_DIR}/(?P<name>{NAME_RE.pattern})(?:@(?P<seq>[0-9]{{1,15}}))?")
_INFO = ("config", "workload", "policies")


def check_name(name: str) -> str:
    """A simulation name: letters, digits, `_`, `-`, `.`, 1-64 characters, not starting with a symbol."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", ".."):
        raise UsageError(f"--name {name!r}: use 1-64 letters, digits, '_', '-' or '.', starting with a letter "
                         "or digit")
    return name


def _damaged(run: str | os.PathLike[str], what: str) -> RunDirError:
    where = f"{run}/manifest.json" if str(run) else "manifest.json"
    return RunDirError(f"run directory damaged: {where}: {what}; re-create it with `prefixscan analyze LOGS -o "
                       f"{run or 'RUN_DIR'} --force`")


def _check_entry(name: Any, entry: Any, run: str | os.PathLike[str]) -> dict[str, Any]:
    """One index entry, checked: a plain name, a directory inside `simulations/` (or "" for the old
    top-level default), plain table names with row counts, an integer seq, dict sections."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", ".."):
        raise _damaged(run, f"simulation name {str(name)[:40]!r} is not a plain name")
    if not isinstance(entry, dict):
        raise _damaged(run, f"simulation {name!r} is not an object")
    rel = entry.get("dir", "")
    if not isinstance(rel, str):
        raise _damaged(run, f"simulation {name!r}: dir is not a string")
    m = _DIR_RE.fullmatch(rel)
    if not (rel == "" and name == DEFAULT) and not (m and m.group("name") == name):
        raise _damaged(run, f"simulation {name!r}: dir {rel[:60]!r} is not {SIM_DIR}/{name}@N")
    tables = entry.get("tables", {})
    if not isinstance(tables, dict) or not all(
            isinstance(t, str) and TABLE_RE.fullmatch(t) and isinstance(n, int) and not isinstance(n, bool)
            for t, n in tables.items()):
        raise _damaged(run, f"simulation {name!r}: tables must map sim_* table names to row counts")
    seq = entry.get("seq", 0)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise _damaged(run, f"simulation {name!r}: seq is not a count")
    for k in _INFO:
        if not isinstance(entry.get(k), dict):
            raise _damaged(run, f"simulation {name!r}: {k} is missing or not an object")
    if not all(isinstance(p, str) and isinstance(m, dict) for p, m in entry["policies"].items()):
        raise _damaged(run, f"simulation {name!r}: policies must map policy names to their metrics")
    return entry


def index(manifest: dict[str, Any], run: str | os.PathLike[str] = "") -> dict[str, dict[str, Any]]:
    """Every stored simulation by name, each entry checked (a run written before named simulations: its
    one, at the top of the run, as `default`)."""
    idx = manifest.get("simulations", {})
    if not isinstance(idx, dict):
        raise _damaged(run, "`simulations` is not an object")
    out = {n: _check_entry(n, e, run) for n, e in idx.items()}
    legacy = manifest.get("simulate")
    if legacy is not None and not isinstance(legacy, dict):
        raise _damaged(run, "`simulate` is not an object")
    if DEFAULT not in out and legacy:
        listed = manifest.get("tables", {})
        tables = {t: int(v.get("rows", 0)) for t, v in listed.items()
                  if isinstance(v, dict) and v.get("stage") == "simulate" and isinstance(v.get("rows", 0), int)
                  } if isinstance(listed, dict) else {}
        out[DEFAULT] = _check_entry(DEFAULT, {"dir": "", "seq": 0, "tables": tables, **legacy}, run)
    return out


def names(manifest: dict[str, Any], run: str | os.PathLike[str] = "") -> list[str]:
    """Stored simulation names, oldest write first."""
    idx = index(manifest, run)
    return sorted(idx, key=lambda n: (idx[n].get("seq", 0), n))


def resolve(manifest: dict[str, Any], name: str | None, run: str | os.PathLike[str] = "") -> str | None:
    """The simulation a reader uses: `name`, else `default`, else the most recent; None when none is stored."""
    known = names(manifest, run)
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
    view = dict(manifest)
    view.pop("simulate", None)
    if chosen is None:
        return view, "", None
    entry = index(manifest, run)[chosen]
    view["simulate"] = {k: entry[k] for k in _INFO if k in entry}
    return view, entry["dir"], chosen


def table_dir(run: str | os.PathLike[str], rel: str) -> Path:
    """The directory of a simulation's tables (`rel` from a checked entry), refusing symlinks that would
    lead out of the run."""
    root = Path(run)
    if not rel:
        return root
    sims = root / SIM_DIR
    where = root / rel
    for p in (sims, where):
        if p.is_symlink():
            raise RunDirError(f"run directory damaged: {p} is a symbolic link; prefixscan writes none there")
    return where


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
    from prefixscan.io.modes import apply_mode, run_mode

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


def listing(manifest: dict[str, Any], run: str | os.PathLike[str] = "") -> list[dict[str, Any]]:
    """One row per stored simulation (oldest first): what `simulate RUN --list` prints."""
    idx = index(manifest, run)
    chosen = resolve(manifest, None, run)
    rows = []
    for n in names(manifest, run):
        e = idx[n]
        cfg, wl = e.get("config", {}), e.get("workload", {})
        rows.append({"name": n, "default": n == chosen, "dir": e.get("dir") or ".",
                     "policies": list(e.get("policies", {})), "replicas": cfg.get("replicas"),
                     "kv_blocks_per_replica": wl.get("kv_blocks_per_replica"), "requests": wl.get("requests"),
                     "tables": sorted(e.get("tables", {}))})
    return rows
