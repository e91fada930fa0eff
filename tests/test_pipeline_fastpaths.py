"""Fast paths of the pipeline's stages against their plain versions: the requests table's background writer
(`write.RowGroups`: the bytes of `rundir.write_parquet` for any chunking, a failed write still a one-line
EnvError naming the table) and the analysis order of a log already in time order."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.errors import EnvError
from prefixscan.pipeline.write import RowGroups
from prefixscan.run import rundir
from prefixscan.schema import REQUESTS_SCHEMA


def _rows(lengths: list[int], seq0: int) -> pa.Table:
    n = len(lengths)
    def filled(f: pa.Field) -> pa.Array:  # required columns get values, the others nulls
        if f.nullable:
            return pa.nulls(n, f.type)
        if pa.types.is_string(f.type):
            return pa.array(["x"] * n, f.type)
        if pa.types.is_boolean(f.type):
            return pa.array([False] * n, f.type)
        return pa.array(np.arange(n) % 7, f.type)

    cols = {f.name: filled(f) for f in REQUESTS_SCHEMA if not pa.types.is_list(f.type)}
    cols["seq"] = pa.array(np.arange(seq0, seq0 + n), pa.int64())
    cols["request_id"] = pa.array([f"r{seq0 + i}" for i in range(n)], pa.string())
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    cols["block_hashes"] = pa.ListArray.from_arrays(pa.array(off), pa.array(np.arange(off[-1], dtype=np.uint64)))
    return pa.table(cols).select([f.name for f in REQUESTS_SCHEMA]).cast(REQUESTS_SCHEMA)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=12), max_size=6), st.booleans())
def test_streamed_groups_have_the_bytes_of_one_write(tmp_path_factory: pytest.TempPathFactory,
                                                    chunks: list[list[int]], wait: bool) -> None:
    tmp = tmp_path_factory.mktemp("rg")
    old = rundir.ROW_GROUP_SIZE, rundir.GROUP_BLOCKS
    rundir.ROW_GROUP_SIZE, rundir.GROUP_BLOCKS = 5, 60
    try:
        out = RowGroups(tmp / "streamed.parquet", tmp / "requests.parquet")
        seq, parts = 0, []
        for lengths in chunks:
            t = _rows(lengths, seq)
            parts.append(t)
            out.write(t, np.array(lengths, np.int64))
            seq += len(lengths)
        out.close(wait=wait)
        out.wait()
        whole = pa.concat_tables(parts) if parts else REQUESTS_SCHEMA.empty_table()
        rundir.write_parquet(whole, tmp / "whole.parquet")
    finally:
        rundir.ROW_GROUP_SIZE, rundir.GROUP_BLOCKS = old
    assert (tmp / "streamed.parquet").read_bytes() == (tmp / "whole.parquet").read_bytes()


def test_a_failed_background_write_is_an_env_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_a: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir, "write_group", full)
    out = RowGroups(tmp_path / "t.parquet", tmp_path / "requests.parquet")
    out.write(_rows([3, 4], 0), np.array([3, 4]))
    with pytest.raises(EnvError, match="requests.parquet"):
        out.close(wait=False)
        out.wait()
    out.abandon()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 5, allow_nan=False), st.just(float("nan")), st.sampled_from([1.0, 2.0])),
                max_size=30))
def test_analysis_order_is_the_time_then_input_lexsort(ts: list[float]) -> None:
    from prefixscan.pipeline.frame import analysis_order

    a = np.array(ts, dtype=np.float64)
    want = np.lexsort((np.arange(len(a)), a)) if len(a) else np.zeros(0, np.int64)
    assert analysis_order(a).tolist() == want.tolist()
