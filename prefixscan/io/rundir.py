"""The run directory: `manifest.json` plus one Parquet file per table.

Every command after `analyze` (findings, simulate, estimate, report, query) reads and extends a run
directory instead of recomputing, so results can be re-rendered and queried without re-running.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prefixscan.errors import RunDirError
from prefixscan.io.atomic import (
    TMP_SUFFIX,
    clean_temps,
    env_error,
    fsync_dir,
    fsync_file,
    is_temp_name,
    replacing,
    temp_path,
    write_text,
)
from prefixscan.io.lock import RunLock
from prefixscan.io.modes import MANIFEST_KEY, apply_mode, parse_mode
from prefixscan.io.simindex import selected_view, table_dir

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def prepare(path: str | os.PathLike[str], force: bool = False) -> Path:
    """Create an empty run directory in place, refusing to replace an existing one unless `force`.

    Kept for callers that build a run by hand; `NewRun` is the safe way (the old run survives a failure)."""
    new = NewRun(path, force)
    return new.commit()


class NewRun:
    """A run directory being built: it is written in a hidden sibling of its target (`path`) under the
    target's lock, and `commit` swaps it in whole, so the target is at every moment either the complete
    old run, the complete new one, or absent, and a failed `--force` run leaves the old one untouched.
    Leftovers of killed runs (hidden siblings, temporaries inside) are removed here first."""

    def __init__(self, target: str | os.PathLike[str], force: bool = False) -> None:
        self.target = Path(target)
        parent = self.target.absolute().parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise env_error(exc, parent) from None
        self.lock = RunLock(self.target).acquire()
        try:
            _restore_orphan(self.target)
            clean_temps(parent, only_prefix=f".{self.target.name}.", legacy=False)
            _check_replaceable(self.target, force)
            self.path = temp_path(self.target, "new-")
            self.path.mkdir()
        except OSError as exc:
            self.lock.release()
            raise env_error(exc, self.target) from None
        except BaseException:
            self.lock.release()
            raise

    def commit(self) -> Path:
        """Make the built run the target (flushed to disk first); releases the lock."""
        try:
            for f in sorted(self.path.iterdir()):
                if f.is_file():
                    fsync_file(f)
            fsync_dir(self.path)
            self.commit_empty()
        except OSError as exc:
            self.abort()
            raise env_error(exc, self.target) from None
        return self.target

    def commit_empty(self) -> None:
        old = temp_path(self.target, "old-")
        try:
            if self.target.exists():
                if not _exchange(self.path, self.target):
                    os.rename(self.target, old)  # a moment without the target: the next NewRun restores it
                    os.rename(self.path, self.target)
                else:
                    os.rename(self.path, old)  # it now holds the old run
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(self.path, self.target)
            fsync_dir(self.target.absolute().parent)
        finally:
            self.lock.release()

    def abort(self) -> None:
        """Remove what was built; the target is as it was. Releases the lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.lock.release()


def _check_replaceable(run: Path, force: bool) -> None:
    if not os.path.lexists(run):
        return
    if not force:
        raise RunDirError(f"run directory {run} already exists; pass --force to replace it or choose another -o")
    if not run.is_dir():
        raise RunDirError(f"{run} exists and is not a directory; choose another -o")
    if (run / MANIFEST).exists():
        return
    others = [p.name for p in run.iterdir() if not is_temp_name(p.name)]
    if others:  # only a killed run's temporaries (or nothing): safe to replace
        raise RunDirError(f"{run} exists and is not a prefixscan run directory (no {MANIFEST}); "
                          "refusing to delete it")


def _restore_orphan(run: Path) -> None:
    """A run killed between the two renames of a swap (systems without an atomic exchange) left the old
    run under a hidden name and no target: put it back before anything else."""
    if os.path.lexists(run):
        return
    for p in sorted(run.absolute().parent.glob(f".{run.name}.old-*{TMP_SUFFIX}")):
        if (p / MANIFEST).exists():
            os.rename(p, run)
            return


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if sys.platform != "linux":
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EXDEV):  # the file system cannot exchange: fall back
        return False
    raise OSError(err, os.strerror(err), str(b))


def run_containing(path: str | os.PathLike[str]) -> Path | None:
    """The run directory `path` is (or lies inside), if any: a command writing a file of its own (e.g.
    `query -o`) must not write into a run, whose files only prefixscan's writers replace."""
    p = Path(os.path.realpath(path))
    for d in (p, *p.parents):
        if (d / MANIFEST).is_file():
            return d
    return None


@contextmanager
def extending(run: str | os.PathLike[str]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Hold the lock of an existing run for a command that adds to it; yields (path, manifest read under
    the lock), after removing a killed writer's temporaries."""
    path = Path(run)
    read_manifest(path)  # a clear error before taking a lock beside something that is not a run
    with RunLock(path):
        clean_temps(path)
        yield path, read_manifest(path)


ROW_GROUP_SIZE = 64 * 1024


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """The deterministic writer settings of every table (a streamed requests table uses them too)."""
    # Block-hash lists are near-unique 64-bit values: a dictionary page for them is built only to be
    # abandoned (a third of the write time on a 1M-request trace), while zstd still finds the repeats.
    flat_cols = [f.name for f in schema if not pa.types.is_list(f.type)]
    # Page checksums (CRC32): readers verify them (read_table_file), so flipped bytes on disk are a damaged
    # run, not silently different numbers.
    return {"compression": "zstd", "write_statistics": True, "use_dictionary": flat_cols,
            "write_page_checksum": True}


GROUP_BLOCKS = 4 << 20  # block hashes per row group of the requests table (32 MB): chat rows hold hundreds


def group_ends(lengths: np.ndarray) -> list[int]:
    """Where the requests table's row groups end (exclusive), given each row's number of block hashes:
    greedily, at most ROW_GROUP_SIZE rows and GROUP_BLOCKS hashes (a longer row is a group alone). The rule
    runs front to back, so a table streamed in pieces is cut exactly where the whole one is."""
    cs = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
    n, ends, start = len(cs) - 1, [], 0
    while start < n:
        by_blocks = int(np.searchsorted(cs, cs[start] + GROUP_BLOCKS, side="right")) - 1
        start = max(start + 1, min(start + ROW_GROUP_SIZE, n, by_blocks))
        ends.append(start)
    return ends


def write_parquet(table: pa.Table, path: str | os.PathLike[str]) -> None:
    if "block_hashes" not in table.column_names or table.num_rows == 0:
        pq.write_table(table, path, row_group_size=ROW_GROUP_SIZE, **parquet_options(table.schema))
        return
    lengths = pc.list_value_length(table.column("block_hashes")).to_numpy(zero_copy_only=False)
    with pq.ParquetWriter(path, table.schema, **parquet_options(table.schema)) as writer:
        start = 0
        for end in group_ends(lengths):
            write_group(writer, table.slice(start, end - start))
            start = end


def write_group(writer: pq.ParquetWriter, rows: pa.Table) -> None:
    """One row group, its columns in one chunk each (page boundaries follow the chunks)."""
    writer.write_table(rows.combine_chunks(), row_group_size=max(rows.num_rows, 1))


def write_table(run: Path, name: str, table: pa.Table) -> Path:
    """Write one table atomically (temp file + rename) with deterministic settings."""
    target = run / f"{name}.parquet"
    with replacing(target) as tmp:
        write_parquet(table, tmp)
    return target


def write_manifest(run: Path, manifest: dict[str, Any]) -> None:
    """Write `manifest.json` atomically, with sorted keys so identical runs give identical bytes."""
    manifest = dict(manifest)
    manifest.setdefault("format_version", FORMAT_VERSION)
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
    write_text(run / MANIFEST, text)


def _redo(run: str | os.PathLike[str]) -> str:
    return f"re-create it with `prefixscan analyze LOGS -o {run} --force`"


def read_manifest(run: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a run's manifest, with a clear error when the directory is not a run or the file is damaged."""
    path = Path(run) / MANIFEST
    if not path.exists():
        raise RunDirError(
            f"{run} is not a prefixscan run directory (no {MANIFEST}); "
            f"create one with `prefixscan analyze LOGS -o {run}`"
        )
    try:
        doc = json.loads(path.read_bytes())
    except OSError as exc:
        raise env_error(exc, path) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise RunDirError(f"{path} is damaged ({str(exc).splitlines()[0][:80]}); {_redo(run)}") from None
    if not isinstance(doc, dict):
        raise RunDirError(f"{path} is damaged (not a JSON object); {_redo(run)}")
    _check_manifest(doc, path, run)
    return doc


# The types of what readers take from a manifest (a key may be absent): a value of another type is a damaged
# (or crafted) run, refused in one line before any command uses it. Nested: (type, {key: type or spec}).
_SUMMARY = {k: dict for k in ("actual_vs_predicted", "by_hit_source", "by_model", "by_prefix_class", "by_tenant",
                              "by_turn", "capacity", "conversations", "counterfactual", "cross_tenant", "hit_rate",
                              "input", "miss_attribution", "requests", "reuse", "reuse_gap_s", "tokens")}
_SCHEMA: dict[str, Any] = {
    "analyze": (dict, {"hit_rate": dict, "requests": (dict, {"rejects_by_reason": dict}), "timings": dict,
                       "notes": list, "summary": (dict, {**_SUMMARY, "findings": list, "notes": list,
                                                         "top_prefixes": list})}),
    "command_line": str, "file_mode": str,
    "config": (dict, {"block_size": int, "hit_rule": str, "tokenizer": str, "granularity": str,
                      "isolate_tenants": bool, "inputs": list, "command_line": str}),
    "format_version": int, "inputs": list,
    "tables": dict, "tool": str, "version": str, "simulate": dict, "simulations": dict, "findings": dict,
    "project_config": dict,
}
_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", bool: "true or false"}


def _check_types(doc: dict[str, Any], schema: dict[str, Any], at: str) -> str | None:
    for key, spec in schema.items():
        if key not in doc or doc[key] is None:
            continue
        kind, inner = spec if isinstance(spec, tuple) else (spec, None)
        value = doc[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{at}{key} is not {_TYPE_NAMES[kind]}"
        if inner is not None:
            bad = _check_types(value, inner, f"{at}{key}.")
            if bad:
                return bad
    return None


def _check_manifest(doc: dict[str, Any], path: Path, run: str | os.PathLike[str]) -> None:
    """Refuse a manifest whose values a reader would misuse: wrong types, table names that are not plain
    names, a file mode beyond read/write bits; simulations are checked by prefixscan.io.simindex."""
    why = _check_types(doc, _SCHEMA, "")
    if why is None and not all(isinstance(t, str) and _PLAIN_TABLE.fullmatch(t) and isinstance(v, dict)
                               for t, v in doc.get("tables", {}).items()):
        why = "tables must map plain table names to objects"
    if why is None and doc.get(MANIFEST_KEY) is not None and parse_mode(doc[MANIFEST_KEY]) is None:
        why = f"{MANIFEST_KEY} {str(doc[MANIFEST_KEY])[:12]!r} is not a file mode within 0666"
    if why is not None:
        raise RunDirError(f"run directory damaged: {path}: {why}; {_redo(run)}")


_PLAIN_TABLE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def read_table_file(path: Path, run: str | os.PathLike[str], **kwargs: Any) -> pa.Table:
    """A run's Parquet table, or a one-line RunDirError when it is truncated or not Parquet."""
    try:
        return pq.read_table(path, page_checksum_verification=True, **kwargs)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise env_error(exc, path) from None
        raise RunDirError(f"{path} is damaged ({str(exc).splitlines()[0][:100]}); {_redo(run)}") from None


def _same_kind(want: pa.DataType, got: pa.DataType) -> bool:
    """Whether a column of type `got` can stand for the schema's `want` (widths and string kinds may vary)."""
    if pa.types.is_null(got):
        return True  # a column that is null throughout
    if pa.types.is_list(want):
        return bool((pa.types.is_list(got) or pa.types.is_large_list(got)) and pa.types.is_integer(got.value_type))
    if pa.types.is_integer(want):
        return bool(pa.types.is_integer(got))
    if pa.types.is_floating(want):
        return bool(pa.types.is_floating(got) or pa.types.is_integer(got))
    if pa.types.is_string(want):
        return bool(pa.types.is_string(got) or pa.types.is_large_string(got) or (
            pa.types.is_dictionary(got) and pa.types.is_string(got.value_type)))
    if pa.types.is_boolean(want):
        return bool(pa.types.is_boolean(got))
    return True


def check_requests_schema(schema: pa.Schema, path: Path, run: str | os.PathLike[str]) -> None:
    """A requests table every reader can use: the columns a replay needs, and each known column of its
    documented kind (prefixscan.schema); anything else is a damaged run (RunDirError, exit 5)."""
    from prefixscan.schema import REQUESTS_SCHEMA
    from prefixscan.sim.workload import REQUIRED

    lacking = [c for c in REQUIRED if c not in schema.names]
    if lacking:
        raise RunDirError(f"run directory damaged: {path} lacks column(s) {', '.join(lacking)} (not a requests "
                          f"table); {_redo(run)}")
    for f in schema:
        i = REQUESTS_SCHEMA.get_field_index(f.name)
        if i >= 0 and not _same_kind(REQUESTS_SCHEMA.field(i).type, f.type):
            raise RunDirError(f"run directory damaged: {path}: column {f.name} is {f.type}, expected "
                              f"{REQUESTS_SCHEMA.field(i).type}; {_redo(run)}")


def read_schema_file(path: Path, run: str | os.PathLike[str]) -> pa.Schema:
    """A run's Parquet table's schema (its footer), or a one-line RunDirError when the file is empty or not
    Parquet."""
    try:
        return pq.read_schema(path)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise env_error(exc, path) from None
        raise RunDirError(f"{path} is damaged ({str(exc).splitlines()[0][:100]}); {_redo(run)}") from None


def add_tables(run: str | os.PathLike[str], tables: dict[str, pa.Table], section: str,
               info: dict[str, Any] | None = None) -> None:
    """Add the tables of a later stage (findings, simulate, ...) and record them in the manifest. Each
    file is replaced atomically under the run's lock, the manifest last, so a failure (a full disk) leaves
    the run as it was, or with a new table the manifest does not list yet."""
    with extending(run) as (path, manifest):
        for name, table in tables.items():
            write_table(path, name, table)
            manifest.setdefault("tables", {})[name] = {"rows": table.num_rows, "stage": section}
        if info is not None:
            manifest[section] = info
        write_manifest(path, manifest)
    apply_mode(run, run_mode(run))  # the new files as private as the run's inputs


def run_mode(run: str | os.PathLike[str]) -> int | None:
    """The file mode `analyze` recorded for this run, if any (checked: read_manifest refuses an insane one)."""
    return parse_mode(read_manifest(run).get(MANIFEST_KEY))


@dataclass
class Run:
    """A run directory opened for reading; tables load on first use. `sim_*` tables come from the chosen
    simulation only (`simulation`, its tables under `sim_dir`; prefixscan.io.simindex): never a stray file."""

    path: Path
    manifest: dict[str, Any]
    _cache: dict[str, pa.Table] = field(default_factory=dict, repr=False)
    _checked: set[str] = field(default_factory=set, repr=False)
    sim_dir: str = ""
    simulation: str | None = None

    def __fspath__(self) -> str:
        """A Run stands for its directory wherever a path is taken; handed on (say to the estimator), it
        keeps the simulation it was opened with, since `load_run` returns it as it is."""
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def tables(self) -> list[str]:
        """The run's own tables and the chosen simulation's."""
        own = [p.stem for p in self.path.glob("*.parquet") if not p.stem.startswith("sim_")]
        return sorted({*own, *self.sim_tables()})

    def sim_tables(self) -> list[str]:
        """The chosen simulation's tables present on disk (none when no simulation is stored)."""
        if self.simulation is None:
            return []
        return sorted(p.stem for p in table_dir(self.path, self.sim_dir).glob("sim_*.parquet"))

    def file(self, name: str) -> Path | None:
        """Where table `name` lives (the chosen simulation's directory for `sim_*`); None: it cannot exist."""
        if name.startswith("sim_"):
            if self.simulation is None:
                return None
            return table_dir(self.path, self.sim_dir) / f"{name}.parquet"
        return self.path / f"{name}.parquet"

    def has(self, name: str) -> bool:
        p = self.file(name)
        return p is not None and p.exists()

    def checked_file(self, name: str) -> Path:
        """The file of table `name`, its footer read (and the requests table's columns checked): for
        readers that read a few columns themselves. A damaged file is a one-line RunDirError."""
        p = self.file(name)
        if p is not None and not p.parent.exists() and self.sim_dir:
            raise RunDirError(f"simulation {self.simulation!r} of run {self.path} was replaced while this command "
                              "read it (another prefixscan simulate); run the command again")
        if p is None or not p.exists():
            raise RunDirError(f"run {self.path} has no table {name!r} (tables: {', '.join(self.tables())})")
        if name not in self._checked:
            schema = read_schema_file(p, self.path)
            if name == "requests":
                check_requests_schema(schema, p, self.path)
            self._checked.add(name)
        return p

    def table(self, name: str) -> pa.Table:
        if name not in self._cache:
            self._cache[name] = read_table_file(self.checked_file(name), self.path)
        return self._cache[name]


def load_run(path: str | os.PathLike[str] | Run, simulation: str | None = None) -> Run:
    """Open a run directory written by `prefixscan analyze`. `simulation` picks a named simulation (default:
    `default`, else the most recent; an unknown name is a UsageError listing the stored ones). Given a Run
    (and no other simulation), returns it: the simulation a caller chose travels with the Run."""
    if isinstance(path, Run):
        if simulation is None or simulation == path.simulation:
            return path
        path = path.path

    manifest, sim_dir, chosen = selected_view(read_manifest(path), simulation, path)
    return Run(Path(path), manifest, sim_dir=sim_dir, simulation=chosen)
