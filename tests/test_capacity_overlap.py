"""The capacity curve of a log held in memory is computed in a background thread beside the aggregates and
findings (`pipeline.run._Curve`): the same bytes as the sequential order, the same errors, a clean abort;
a streamed log keeps the sequential order. Also the two things the overlap relies on: every compiled
kernel the curve calls from Python releases the GIL, and no numba parallel kernel exists."""

from __future__ import annotations

import filecmp
import importlib
import inspect
import json
import pkgutil
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
from numba.core.registry import CPUDispatcher

import prefixscan
import prefixscan.detect.run as findings_mod
import prefixscan.pipeline.run as run_mod
import prefixscan.reuse.capacity.whole as whole_mod
from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.run import run_analysis
from prefixscan.reuse.capacity.whole import WholeCapacity
from prefixscan.synth import SynthConfig, write
from tests.conftest import MOONCAKE, ROOT

MOONCAKE_SMALL = str(ROOT / "sample_logs" / "mooncake_small.jsonl")


def _run(inp: str, out: Path, overlap: bool, monkeypatch: pytest.MonkeyPatch, **opts: object):
    monkeypatch.setattr(run_mod, "OVERLAP_CAPACITY", overlap)
    return run_analysis(AnalyzeConfig(inputs=(inp,), output=str(out), **opts))


def _assert_same_run(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        if name.endswith(".parquet"):
            assert filecmp.cmp(a / name, b / name, shallow=False), f"{name} differs"
    sa, sb = (json.loads((p / "manifest.json").read_text())["analyze"]["summary"] for p in (a, b))
    ta, tb = sa.pop("timings"), sb.pop("timings")
    for s in (sa, sb):  # the encode stage's own run statistics (CPU seconds), not results
        s["input"].pop("tokenizer_stats", None)
    assert sa == sb
    assert "capacity_wait_s" not in ta and "capacity_wait_s" in tb  # sequential, then in the background
    assert tb["capacity_s"] > 0 and tb["peak_rss_mib_capacity"] >= 0


def _chat_log(tmp: Path) -> str:
    cfg = SynthConfig(requests=150, seed=7, prompt_tokens=500, tenants=2)  # default scenarios: breakers too
    log = tmp / "chat.jsonl"
    write(cfg, str(log), truth_path=None)
    return str(log)


def _trace_head(tmp: Path) -> str:
    lines = (MOONCAKE / "conversation_trace.jsonl").read_text().splitlines()[:3000]
    log = tmp / "trace.jsonl"
    log.write_text("\n".join(lines) + "\n")
    return str(log)


@pytest.mark.parametrize("make", [lambda t: MOONCAKE_SMALL, lambda t: str(ROOT / "sample_logs" / "chat.jsonl"),
                                  _chat_log, _trace_head], ids=["mooncake_small", "chat", "synth_chat", "mooncake"])
def test_overlap_writes_the_sequential_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make) -> None:
    if make is _trace_head and not MOONCAKE.exists():
        pytest.skip("shared/data/mooncake not present")
    inp = make(tmp_path)
    seq = _run(inp, tmp_path / "seq", False, monkeypatch)
    ovl = _run(inp, tmp_path / "ovl", True, monkeypatch)
    _assert_same_run(Path(seq.run_dir), Path(ovl.run_dir))
    assert ovl.tables["capacity_curve"].equals(seq.tables["capacity_curve"], check_metadata=True)


def test_overlap_without_a_run_directory_and_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    for opts in ({}, {"capacity_sample": 0.5}, {"capacities": (512, 4096, 65536)}):
        monkeypatch.setattr(run_mod, "OVERLAP_CAPACITY", False)
        seq = prefixscan.analyze(MOONCAKE_SMALL, **opts)
        monkeypatch.setattr(run_mod, "OVERLAP_CAPACITY", True)
        ovl = prefixscan.analyze(MOONCAKE_SMALL, **opts)
        assert ovl.tables["capacity_curve"].equals(seq.tables["capacity_curve"], check_metadata=True)
        assert "capacity_wait_s" in ovl.timings


def _failing_curve(monkeypatch: pytest.MonkeyPatch, seen: list[str], exc: BaseException,
                   gate: threading.Event | None = None) -> None:
    def boom(*_a: object, **_k: object) -> None:
        seen.append(threading.current_thread().name)
        if gate is not None:
            gate.wait(30)
        raise exc

    monkeypatch.setattr(whole_mod, "capacity_curve", boom)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_error_in_the_curve_propagates_and_leaves_no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            overlap: bool) -> None:
    seen: list[str] = []
    err = RuntimeError("capacity failed")
    _failing_curve(monkeypatch, seen, err)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="capacity failed") as got:
        _run(MOONCAKE_SMALL, out, overlap, monkeypatch)
    assert got.value is err  # the thread's own exception, raised again as it is
    assert seen == ["prefixscan-capacity" if overlap else "MainThread"]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_curve_error_wins_as_in_the_sequential_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both the curve and the findings fail: the sequential order computed the curve first, so its error is
    what a run raised; the overlap raises it too (after waiting for the thread)."""
    seen: list[str] = []
    gate = threading.Event()
    _failing_curve(monkeypatch, seen, ValueError("curve"), gate)

    def findings_fail(*_a: object, **_k: object) -> None:
        gate.set()  # the curve fails only once the findings are failing too
        raise RuntimeError("findings")

    monkeypatch.setattr(findings_mod, "run_findings", findings_fail)
    for overlap in (True, False):  # sequential: the gate is open by then
        with pytest.raises(ValueError, match="curve"):
            _run(MOONCAKE_SMALL, tmp_path / "run", overlap, monkeypatch)
        assert list(tmp_path.iterdir()) == []


def test_an_error_beside_a_good_curve_is_raised_and_leaves_no_run(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def findings_fail(*_a: object, **_k: object) -> None:
        raise RuntimeError("findings")

    monkeypatch.setattr(findings_mod, "run_findings", findings_fail)
    with pytest.raises(RuntimeError, match="findings"):
        _run(MOONCAKE_SMALL, tmp_path / "run", True, monkeypatch)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_aborts_without_waiting_for_the_curve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    gate = threading.Event()  # the curve never finishes until the test lets it
    _failing_curve(monkeypatch, seen, RuntimeError("never seen"), gate)

    def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(findings_mod, "run_findings", interrupted)
    t = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            _run(MOONCAKE_SMALL, tmp_path / "run", True, monkeypatch)
        assert time.perf_counter() - t < 20  # did not wait for the 30 s gate
        assert seen == ["prefixscan-capacity"] and list(tmp_path.iterdir()) == []
    finally:
        gate.set()


@pytest.mark.parametrize("how", ["streamed", "handed_over"])
def test_a_streamed_curve_stays_sequential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A streamed log (and a one-chunk log whose capacity input grew past WholeCapacity's limit) computes
    the curve in the run's thread before the aggregates, as before: bounded memory."""
    from prefixscan.reuse.capacity.stream import CapacityStream

    threads: list[str] = []
    finish = CapacityStream.finish

    def spy(self, *a: object, **k: object):
        threads.append(threading.current_thread().name)
        return finish(self, *a, **k)

    monkeypatch.setattr(CapacityStream, "finish", spy)
    opts: dict = {"streaming": True}
    if how == "handed_over":
        monkeypatch.setattr(WholeCapacity.__init__, "__kwdefaults__", {"max_blocks": 5})
        opts = {}
    res = _run(MOONCAKE_SMALL, tmp_path / "run", True, monkeypatch, **opts)
    assert threads == ["MainThread"]
    assert "capacity_wait_s" not in res.timings
    want = _run(MOONCAKE_SMALL, tmp_path / "want", False, monkeypatch, streaming=False)
    assert res.tables["capacity_curve"].equals(want.tables["capacity_curve"], check_metadata=True)


def test_take_gives_finish_and_closes(tmp_path: Path) -> None:
    def fed() -> WholeCapacity:
        wc = WholeCapacity(4, "vllm", str(tmp_path))
        wc.add(np.array([0, 2, 5]), np.array([0, 1, 0, 1, 2], np.int32), np.array([9, 13]))
        return wc

    wc = fed()
    assert wc.held
    job = wc.take(3, [8, 12])
    assert not wc.held
    with pytest.raises(RuntimeError):
        wc.take(3)
    assert job().equals(fed().finish(3, [8, 12]), check_metadata=True)
    bad = fed()
    with pytest.raises(ValueError):
        bad.take(2)  # block id 2 fed with two distinct blocks: refused at once, and closed
    assert not bad.held


# ---------------------------------------------------------------- what the overlap relies on

CURVE_MODULES = ("capacity.lru", "capacity.table", "capacity.whole", "capacity.sampled", "capacity.sampled_kernel",
                 "pool", "pool_fast")


def _called_from_python(mod: types.ModuleType) -> set[tuple[str, CPUDispatcher]]:
    """Compiled functions the module's Python functions (and their nested functions) call by name."""
    found = set()

    def names(code: types.CodeType) -> set[str]:
        out = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                out |= names(c)
        return out

    for _, fn in inspect.getmembers(mod, inspect.isfunction):
        if fn.__module__ != mod.__name__:
            continue
        for n in names(fn.__code__):
            target = mod.__dict__.get(n)
            if isinstance(target, CPUDispatcher):
                found.add((n, target))
    return found


def test_every_kernel_the_curve_calls_releases_the_gil() -> None:
    entries = set()
    for name in CURVE_MODULES:
        entries |= _called_from_python(importlib.import_module(f"prefixscan.reuse.{name}"))
    names = {n for n, _ in entries}
    assert {"_lru_pool_chunk", "_opt_one", "_pool_one", "_block_weights"} <= names
    held = sorted(n for n, d in entries if not d.targetoptions.get("nogil"))
    assert held == [], f"compiled functions called from Python that hold the GIL: {held}"


def test_no_parallel_kernel() -> None:
    """The capacity thread runs its kernels on plain threads (`pool.run_each`) while the aggregates and
    findings run, and the package has no numba parallel kernel: none launches numba's threading layer
    beside them. A new parallel kernel needs that looked at again (docs/pipeline.md)."""
    parallel = set()
    for info in pkgutil.walk_packages(prefixscan.__path__, "prefixscan."):
        if info.name.startswith(("prefixscan.encode.ray", "prefixscan.__main__")):
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (ray, ...) is absent
            continue
        for n, obj in vars(mod).items():
            if isinstance(obj, CPUDispatcher) and obj.targetoptions.get("parallel") and \
                    obj.py_func.__module__ == info.name:
                parallel.add(f"{info.name}.{n}")
    assert parallel == set()
