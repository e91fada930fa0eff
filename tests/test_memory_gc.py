"""`memory.fewer_collections`: fewer cyclic-GC passes while a pipeline runs, everything undone after."""

from __future__ import annotations

import gc

import pytest

from prefixscan import memory
from prefixscan.pipeline.encode_pool import MAX_SHARE, PRIOR_MAIN_COST, balance_share


def test_fewer_collections_raises_the_young_threshold_and_restores_it() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with memory.fewer_collections():
        assert gc.get_threshold()[0] == max(before[0], memory.YOUNG_THRESHOLD)
        assert gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > 0  # what was alive on entry is out of every pass
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_callers_frozen_objects_stay_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with memory.fewer_collections():
            assert gc.get_threshold()[0] >= memory.YOUNG_THRESHOLD
        assert gc.get_freeze_count() == frozen  # neither thawed nor frozen further by the run
    finally:
        gc.unfreeze()


def test_fewer_collections_restores_on_error_and_still_collects_cycles() -> None:
    before = gc.get_threshold()

    class Node:
        pass

    with pytest.raises(RuntimeError), memory.fewer_collections():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle made inside is collected, only later
        del a, b
        assert gc.collect() >= 2
        raise RuntimeError("boom")
    assert gc.get_threshold() == before


def test_balance_share() -> None:
    # equal costs: with one worker this process's own work already matches a worker's, so it encodes none
    assert balance_share(1.0, 1.0, 1) == 0.0
    # no own work: the records split evenly over the W + 1 processes
    assert balance_share(1.0, 0.0, 1) == pytest.approx(0.5)
    assert balance_share(1.0, 0.0, 3) == pytest.approx(0.25)
    # this process ends with the worker: m + s*e == (1 - s)*e/W
    e, m, w = 0.25, 0.15, 1
    s = balance_share(e, m, w)
    assert m + s * e == pytest.approx((1 - s) * e / w)
    assert balance_share(0.0, 0.1, 1) == 0.0
    assert balance_share(1.0, -10.0, 1) == MAX_SHARE
    # the prior a pool starts from: some share with one worker, none with many
    assert 0 < balance_share(1.0, PRIOR_MAIN_COST, 1) < 0.5
    assert balance_share(1.0, PRIOR_MAIN_COST, 4) == 0.0
    # a worker's cost per record above this process's (it unpickles and does the detector's content work):
    # this process takes more, still ending with the workers
    e, e_main, m, w = 0.58, 0.41, 0.15, 1
    s = balance_share(e, m, w, e_main)
    assert s > balance_share(e, m, w)
    assert m + s * e_main == pytest.approx((1 - s) * e / w)
    assert balance_share(e, m, 2, e_main) == pytest.approx((e - 2 * m) / (2 * e_main + e))
