"""Write stage: the run directory's files — the requests table row group by row group as chunks come,
the other tables and the manifest at the end.

Every table is written with `rundir.write_table`'s settings and row-group cuts (`rundir.group_ends`), so
a requests table written chunk by chunk has the bytes of one written at once.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.encode import Ingested
from prefixscan.privacy import scrub_command_line
from prefixscan.run import rundir
from prefixscan.run.atomic import env_error
from prefixscan.run.modes import MANIFEST_KEY as MODE_KEY
from prefixscan.run.modes import apply_mode, input_mode
from prefixscan.schema import REQUESTS_SCHEMA
from prefixscan.version import __version__


class RowGroups:
    """requests.parquet (or, given its schema, another table: misses.parquet) written group by group, with
    the settings and group cuts of `rundir.write_table` (`rundir.group_ends`; a table without block hashes
    passes zeros as their counts), so a streamed file has the bytes of one written at once.

    Groups are compressed and written by one background thread, in order (the Parquet writer releases the
    GIL): the reuse stage goes on with the next chunk, and the last groups are written while the capacity
    curve is computed. `close(wait=False)` hands the end of the file to that thread; `wait()` returns once
    the file is complete (and raises what the writes raised)."""

    def __init__(self, path: Path, target: Path, schema: pa.Schema = REQUESTS_SCHEMA) -> None:
        self.path, self.target = path, target  # the file written, and the name errors give (the run's table)
        self.schema = schema
        self.parts: list[pa.Table] = []
        self.lengths: list[np.ndarray] = []
        self.writer: pq.ParquetWriter | None = None
        self.file: Any = None
        self._thread: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def write(self, table: pa.Table, lengths: np.ndarray) -> None:
        """Buffer rows (with their block counts); write every group that can no longer grow."""
        if not table.num_rows:
            return
        self.parts.append(table)
        self.lengths.append(np.asarray(lengths, dtype=np.int64))
        ends = rundir.group_ends(np.concatenate(self.lengths))
        full = ends[-1] - (ends[-2] if len(ends) > 1 else 0) == rundir.ROW_GROUP_SIZE
        self._flush(ends if full else ends[:-1])

    def _flush(self, ends: list[int]) -> None:
        if not ends:
            return
        self._check(block=False)
        whole = pa.concat_tables(self.parts)
        try:
            if self.writer is None:
                # through a Python file, so a full disk or file-size limit arrives with its errno
                self.file = open(self.path, "wb")  # closed in close() or _discard
                self.writer = pq.ParquetWriter(self.file, self.schema, **rundir.parquet_options(self.schema))
        except OSError as exc:
            raise env_error(exc, self.target) from None
        start, groups = 0, []
        for end in ends:
            groups.append(whole.slice(start, end - start))
            start = end
        self._submit(self._write_groups, self.writer, groups)
        rest = whole.slice(start)
        lengths = np.concatenate(self.lengths)[start:]
        self.parts, self.lengths = ([rest], [lengths]) if rest.num_rows else ([], [])

    @staticmethod
    def _write_groups(writer: pq.ParquetWriter, groups: list[pa.Table]) -> None:
        for g in groups:
            rundir.write_group(writer, g)

    def _submit(self, fn: Any, *args: Any) -> None:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefixscan-requests-writer")
        self._pending.append(self._thread.submit(fn, *args))

    def _check(self, block: bool) -> None:
        """Raise the first failed write (as an EnvError naming the table); with `block`, wait for all."""
        while self._pending and (block or self._pending[0].done()):
            try:
                self._pending.pop(0).result()
            except OSError as exc:
                raise env_error(exc, self.target) from None

    def close(self, wait: bool = True) -> None:
        """Write the last groups and the footer (in the background with `wait=False`: then `wait()`)."""
        if self.parts:
            self._flush(rundir.group_ends(np.concatenate(self.lengths)))
        self._submit(self._close_file)
        if wait:
            self.wait()

    def _close_file(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.file.close()
        else:  # no rows: the same empty file a table written at once has
            rundir.write_parquet(self.schema.empty_table(), self.path)

    def wait(self) -> None:
        """Block until every write handed to the thread is done; the thread then ends."""
        try:
            self._check(block=True)
        finally:
            if self._thread is not None and not self._pending:
                self._thread.shutdown(wait=True)
                self._thread = None

    def abandon(self) -> None:
        """Close what is open after a failure (the caller removes the file)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
            self._thread, self._pending = None, []
        for f in (self.writer, self.file):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


@contextmanager
def writing(run_path: Path) -> Iterator[None]:
    """A failed write of the run's working files (the requests table, spills) as a one-line EnvError
    naming the run."""
    try:
        yield
    except OSError as exc:
        raise env_error(exc, run_path) from None


class OnDisk:
    """A table already written to the run directory, read only if someone asks for it."""

    def __init__(self, path: Path, rows: int) -> None:
        self.path, self.num_rows = path, rows


class Tables(dict[str, Any]):
    """The result's tables by name; the requests and misses tables are read from their Parquet files on
    first access (they are the size of the log). The pipeline itself uses `dict.items(tables)`, which
    leaves them on disk."""

    def __getitem__(self, name: str) -> pa.Table:
        t = super().__getitem__(name)
        if isinstance(t, OnDisk):
            t = pq.read_table(t.path)
            self[name] = t
        return t

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def values(self) -> list[pa.Table]:  # type: ignore[override]
        return [self[name] for name in self]

    def items(self) -> list[tuple[str, pa.Table]]:  # type: ignore[override]
        return [(name, self[name]) for name in self]


def write_run(run_path: Path, cfg: AnalyzeConfig, ing: Ingested, tables: dict[str, Any],
              summary: dict[str, Any]) -> None:
    """The tables (a requests table already on disk is moved in), then the manifest, then the modes."""
    for name, t in dict.items(tables):
        if isinstance(t, OnDisk):
            os.replace(t.path, run_path / f"{name}.parquet")
            t.path = run_path / f"{name}.parquet"
        else:
            rundir.write_table(run_path, name, t)
    mode = input_mode(s.path for s in ing.sources)
    rundir.write_manifest(run_path, {**_manifest(cfg, ing, tables, summary), MODE_KEY: f"{mode:04o}"})
    apply_mode(run_path, mode)  # every file of the run as private as the least readable input


def _manifest(cfg: AnalyzeConfig, ing: Ingested, tables: dict[str, pa.Table], summary: dict[str, Any]) -> dict:
    return {
        "tool": "prefixscan", "version": __version__,
        "command_line": scrub_command_line(cfg.command_line or shlex.join(sys.argv)),
        "config": {**replace(cfg, extras={}).to_json(), "block_size": ing.block_size, "hit_rule": ing.hit_rule,
                   "token_block_size": cfg.block_size},
        "inputs": [s.to_json() for s in ing.sources],
        "tables": {name: {"rows": t.num_rows, "stage": "analyze"} for name, t in dict.items(tables)},
        # The whole summary, so reports and later commands re-render without re-analysing.
        "analyze": {"timings": summary.get("timings", {}), "hit_rate": summary["hit_rate"],
                    "requests": summary["requests"], "summary": summary},
    }
