"""The run directory: `manifest.json` plus one Parquet file per table, written here (reading one is
prefixscan.run.load's: `Run.open`, `read_manifest`, whose names stay importable from here).

Every command after `analyze` reads and extends a run directory instead of recomputing. A new run is
swapped in whole (`NewRun`), tables and manifest are added under the run's lock (`extending`). One writer
per run (`RunLock`): `.<run name>.lock` in the run's parent (a new run does not exist yet, and `--force`
swaps the whole directory), held with the kernel's `flock`, which is released however its holder dies, so
a killed run's lock is simply taken over. docs/analyze.md, "The run directory is complete or absent".
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prefixscan.errors import RunDirError, RunLockedError
from prefixscan.run.atomic import (
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
from prefixscan.run.load import MANIFEST, read_manifest
from prefixscan.run.modes import MANIFEST_KEY, apply_mode, parse_mode

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: O_EXCL files with pid liveness instead
    fcntl = None  # type: ignore[assignment]

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
        old = temp_path(self.target, "old-")
        try:
            for f in sorted(self.path.iterdir()):
                if f.is_file():
                    fsync_file(f)
            fsync_dir(self.path)
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
        except OSError as exc:
            self.abort()
            raise env_error(exc, self.target) from None
        finally:
            self.lock.release()
        return self.target

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


# ---------------------------------------------------------------- the writer lock

_HELD: dict[str, list[int]] = {}  # lock path -> [fd, depth] of the locks this process holds


def lock_path(run: str | os.PathLike[str]) -> Path:
    """Where the lock of run directory `run` lives."""
    r = Path(os.path.abspath(run))
    return r.parent / f".{r.name}.lock"


class RunLock:
    """Exclusive writer lock of one run directory; a context manager. Refuses at once (no waiting): two
    runs writing the same directory is a mistake to report, not a queue to form."""

    def __init__(self, run: str | os.PathLike[str]) -> None:
        self.run = Path(run)
        self.path = lock_path(run)
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock, or raise RunLockedError naming the holder (re-entrant within one process)."""
        held = _HELD.get(str(self.path))
        if held is not None:
            held[1] += 1
            self._fd = held[0]
            return self
        for _ in range(20):  # the holder may remove the file between our open and our lock: retry
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise env_error(exc, self.path) from None
            if not self._try_lock(fd):
                holder = _read_pid(fd)
                os.close(fd)
                raise RunLockedError(
                    f"run directory {self.run} is in use: another prefixscan (pid {holder or '?'}, lock "
                    f"{self.path}) is writing it; wait for it to finish or write to another -o")
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # we locked a file the last holder had already removed
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd
            _HELD[str(self.path)] = [fd, 1]
            return self
        raise RunLockedError(f"could not take the lock {self.path}; another prefixscan keeps replacing it")

    @staticmethod
    def _try_lock(fd: int) -> bool:
        if fcntl is None:  # pragma: no cover
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        held = _HELD.get(str(self.path))
        if held is not None and held[1] > 1:
            held[1] -= 1
            self._fd = None
            return
        _HELD.pop(str(self.path), None)
        try:
            self.path.unlink(missing_ok=True)  # while still holding it: a waiter re-checks the inode
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
