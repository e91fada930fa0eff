"""WholeCapacity (a one-chunk log's capacity input kept in memory) gives CapacityStream's table, held or
handed over to a stream part way, sampled or not."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.reuse.capacity.stream import CapacityStream
from prefixscan.reuse.capacity.whole import WholeCapacity
from tests.test_capacity_stream import assert_same, feed, logs


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_whole_equals_stream(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    block_size = data.draw(st.sampled_from([1, 4, 16]))
    rule = data.draw(st.sampled_from(["vllm", "trace"]))
    log = data.draw(logs(block_size))
    n = log[3]
    cuts = data.draw(st.lists(st.integers(0, len(log[2])), max_size=3))
    caps = data.draw(st.none() | st.lists(st.integers(0, 40 * block_size), max_size=5))
    opt = data.draw(st.booleans())
    sample = data.draw(st.sampled_from([None, None, 0.5]))
    max_blocks = data.draw(st.sampled_from([1 << 25, 0, 5]))  # held, handed over at once, part way
    tmp = tmp_path_factory.mktemp("whole")
    cs = CapacityStream(block_size, rule, str(tmp), defer_lru=True)
    feed(cs, log, cuts)
    want = cs.finish(n, caps, opt, sample)
    wc = WholeCapacity(block_size, rule, str(tmp), max_blocks=max_blocks)
    feed(wc, log, cuts)  # type: ignore[arg-type]
    assert wc.total_blocks == len(log[1])
    assert_same(wc.finish(n, caps, opt, sample), want)
    assert not os.listdir(tmp)  # every spill removed


def test_whole_refuses_misuse(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        WholeCapacity(0, "vllm", str(tmp_path))
    wc = WholeCapacity(4, "vllm", str(tmp_path))
    wc.add(np.array([0, 2]), np.array([0, 1], np.int32), np.array([8]))
    with pytest.raises(ValueError):
        wc.finish(1)  # block id 1 fed with one distinct block
    with pytest.raises(RuntimeError):
        wc.add(np.array([0, 1]), np.array([0], np.int32), np.array([4]))
    assert not os.listdir(tmp_path)
