"""Encode workers started early (prefixscan/pipeline/early.py): claimed by the run they were started for,
stopped when no run claims them, never started for inputs that will not use them; the same bytes out."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

import prefixscan.pipeline.encode_workers as pool_mod
from prefixscan.config import AnalyzeConfig
from prefixscan.errors import PrefixscanError
from prefixscan.pipeline.early import start_encode_workers
from prefixscan.pipeline.run import run_analysis
from tests.conftest import ROOT, chat, write_jsonl


@pytest.fixture
def spawns(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every set of workers spawned, in order."""
    got: list = []
    real = pool_mod._spawn

    def counted(*args: object) -> pool_mod.Spawned:
        got.append(real(*args))
        return got[-1]

    monkeypatch.setattr(pool_mod, "_spawn", counted)
    return got


def _log(tmp: Path) -> str:
    return str(write_jsonl(tmp / "c.jsonl", [chat(i, f"c{i % 4}", i // 4 + 1) for i in range(24)]))


def test_the_run_claims_its_early_workers(tmp_path: Path, spawns: list) -> None:
    log = _log(tmp_path)
    cfg = AnalyzeConfig(inputs=(log,), output=str(tmp_path / "early"), workers=1)
    assert start_encode_workers(cfg)
    early = run_analysis(cfg)
    assert len(spawns) == 1 and pool_mod._EARLY is None  # the pool took the early workers
    assert not spawns[0].procs[0].is_alive()  # and closed them at the end
    assert early.summary["input"]["tokenizer_stats"]["encode_workers"] == 1
    plain = run_analysis(AnalyzeConfig(inputs=(log,), output=str(tmp_path / "w0"), workers=0))
    names = sorted(p.name for p in Path(plain.run_dir).glob("*.parquet"))
    assert names and names == sorted(p.name for p in Path(early.run_dir).glob("*.parquet"))
    for name in names:
        assert filecmp.cmp(Path(plain.run_dir) / name, Path(early.run_dir) / name, shallow=False), name


def test_workers_for_other_options_are_replaced(tmp_path: Path, spawns: list) -> None:
    log = _log(tmp_path)
    assert start_encode_workers(AnalyzeConfig(inputs=(log,), workers=1, block_size=32))
    run_analysis(AnalyzeConfig(inputs=(log,), workers=1, findings=False))
    assert len(spawns) == 2 and not spawns[0].procs[0].is_alive()
    assert pool_mod._EARLY is None


def test_unclaimed_workers_stop_when_the_run_fails(tmp_path: Path, spawns: list) -> None:
    log = _log(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("not a run")
    cfg = AnalyzeConfig(inputs=(log,), output=str(tmp_path / "taken"), workers=1)
    assert start_encode_workers(cfg)
    with pytest.raises(PrefixscanError):
        run_analysis(cfg)
    assert pool_mod._EARLY is None and not spawns[0].procs[0].is_alive()


def test_no_early_start_where_no_worker_would_run(tmp_path: Path, spawns: list) -> None:
    log = _log(tmp_path)
    trace = str(ROOT / "sample_logs" / "mooncake_small.jsonl")
    assert not start_encode_workers(AnalyzeConfig(inputs=(trace,), workers=1))  # a hashed trace
    assert not start_encode_workers(AnalyzeConfig(inputs=(log,), workers=0))
    assert not start_encode_workers(AnalyzeConfig(inputs=(log,)))  # too small for a worker
    assert not start_encode_workers(AnalyzeConfig(inputs=(str(tmp_path),), workers=1))  # a directory: later
    assert not start_encode_workers(AnalyzeConfig(inputs=(log,), workers=1, block_size=0))  # a bad option
    assert not start_encode_workers(AnalyzeConfig(inputs=(log,), workers=1, engine="ray"))
    assert spawns == []
