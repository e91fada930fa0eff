"""The run directory: `manifest.json` plus one Parquet file per table.

Every command after `analyze` (findings, simulate, estimate, report, query) reads and extends a run
directory instead of recomputing, so results can be re-rendered and queried without re-running.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prefixscan.errors import RunDirError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def prepare(path: str | os.PathLike[str], force: bool = False) -> Path:
    """Create an empty run directory, refusing to replace an existing one unless `force`."""
    run = Path(path)
    if run.exists():
        if not force:
            raise RunDirError(
                f"run directory {run} already exists; pass --force to replace it or choose another -o"
            )
        if run.is_dir() and not (run / MANIFEST).exists() and any(run.iterdir()):
            raise RunDirError(
                f"{run} exists and is not a prefixscan run directory (no {MANIFEST}); refusing to delete it"
            )
        if run.is_dir():
            shutil.rmtree(run)
        else:
            raise RunDirError(f"{run} exists and is a file; choose another -o")
    run.mkdir(parents=True)
    return run


ROW_GROUP_SIZE = 64 * 1024


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """The deterministic writer settings of every table (a streamed requests table uses them too)."""
    # Block-hash lists are near-unique 64-bit values: a dictionary page for them is built only to be
    # abandoned (a third of the write time on a 1M-request trace), while zstd still finds the repeats.
    flat_cols = [f.name for f in schema if not pa.types.is_list(f.type)]
    return {"compression": "zstd", "write_statistics": True, "use_dictionary": flat_cols}


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
    fd, tmp = tempfile.mkstemp(dir=run, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    write_parquet(table, tmp)
    os.replace(tmp, target)
    return target


def write_manifest(run: Path, manifest: dict[str, Any]) -> None:
    """Write `manifest.json` with sorted keys so identical runs give identical bytes."""
    manifest = dict(manifest)
    manifest.setdefault("format_version", FORMAT_VERSION)
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
    (run / MANIFEST).write_text(text)


def read_manifest(run: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a run's manifest, with a clear error when the directory is not a run."""
    path = Path(run) / MANIFEST
    if not path.exists():
        raise RunDirError(
            f"{run} is not a prefixscan run directory (no {MANIFEST}); "
            f"create one with `prefixscan analyze LOGS -o {run}`"
        )
    return json.loads(path.read_text())


def add_tables(run: str | os.PathLike[str], tables: dict[str, pa.Table], section: str,
               info: dict[str, Any] | None = None) -> None:
    """Add the tables of a later stage (findings, simulate, ...) and record them in the manifest."""
    run = Path(run)
    manifest = read_manifest(run)
    for name, table in tables.items():
        write_table(run, name, table)
        manifest.setdefault("tables", {})[name] = {"rows": table.num_rows, "stage": section}
    if info is not None:
        manifest[section] = info
    write_manifest(run, manifest)


@dataclass
class Run:
    """A run directory opened for reading; tables load on first use."""

    path: Path
    manifest: dict[str, Any]
    _cache: dict[str, pa.Table] = field(default_factory=dict, repr=False)

    def tables(self) -> list[str]:
        return sorted(p.stem for p in self.path.glob("*.parquet"))

    def has(self, name: str) -> bool:
        return (self.path / f"{name}.parquet").exists()

    def table(self, name: str) -> pa.Table:
        if name not in self._cache:
            p = self.path / f"{name}.parquet"
            if not p.exists():
                raise RunDirError(f"run {self.path} has no table {name!r} (tables: {', '.join(self.tables())})")
            self._cache[name] = pq.read_table(p)
        return self._cache[name]


def load_run(path: str | os.PathLike[str]) -> Run:
    """Open a run directory written by `prefixscan analyze`."""
    return Run(Path(path), read_manifest(path))
