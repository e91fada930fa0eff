"""The manifest's index of named simulations, read and checked (prefixscan.run.simstore stores them).

The layout is described in prefixscan.run.simstore. This module only reads: the index by name, each entry
checked before use (a damaged or crafted entry is a one-line RunDirError, exit 5), the one a reader uses
(`resolve`: NAME when given, else `default`, else the most recent), and where its tables live. The run
directory reader (prefixscan.run.rundir) chooses a simulation with it, so it must not import rundir.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from prefixscan.errors import RunDirError, UsageError

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
