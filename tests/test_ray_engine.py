"""`analyze --engine ray` writes the local path's tables byte for byte, on a local Ray cluster of 2 CPUs."""

from __future__ import annotations

import contextlib
import filecmp
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.run import run_analysis
from tests.conftest import ROOT, chat, write_jsonl
from tests.s3_server import HAS_MOTO, NO_MOTO, env, s3_server, upload
from tests.test_remote_inputs import local_inputs, same_run
from tests.test_stream import _chat_log, tiny_chunks  # noqa: F401 - a fixture

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed: pip install 'prefixscan[ray]' (make test "
                                                    "installs it)")
# What may differ between the engines: the encoders' work counters and the clocks (docs/scale.md).
ENGINE_DEPENDENT = {"timings"}


@pytest.fixture(scope="module")
def ray_cluster():
    """One local cluster of 2 CPUs for the module (its start-up is most of the cost); with moto, a local
    S3 server too, whose endpoint the cluster's workers get in their environment."""
    import ray

    with contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(s3_server()) if HAS_MOTO else None
        runtime_env = {"env_vars": env(endpoint)} if endpoint else None
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 runtime_env=runtime_env)
        try:
            yield endpoint
        finally:
            ray.shutdown()


def _log(path: Path) -> Path:
    """Two tenants, a tenant-less conversation, equal timestamps, a malformed line and a duplicate id."""
    recs, i = [], 0
    for turn in range(1, 5):
        for conv, tenant in (("c1", "acme"), ("c2", "acme"), ("c3", "globex"), ("c4", None)):
            recs.append(chat(i, conv, turn, tenant=tenant, ts=float(i // 3)))
            i += 1
    recs.append({"request_id": "nc", "timestamp": 1_700_000_100, "model": "m",
                 "messages": [{"role": "user", "content": "no conversation id: one is inferred"}]})
    recs.append("{not json")
    recs.append(chat(0, "c9", 1))
    return write_jsonl(path, recs)


def _otlp(path: Path) -> Path:
    """One OTLP export line of six GenAI spans (records that share a line), one of them twice (a duplicate)."""
    from tests.test_ecosystem_shapes import attr, genai

    spans = [{"traceId": "t1", "spanId": f"s{i}", "name": "chat",
              "startTimeUnixNano": str(1_700_000_000_000_000_000 + i * 10**9),
              "attributes": [attr(k, v) for k, v in genai(i, f"o{i % 2}", i // 2 + 1).items()]} for i in range(6)]
    spans.insert(3, {**spans[1], "attributes": [attr(k, v) for k, v in genai(5, "o9", 1).items()]})
    return write_jsonl(path, [{"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}])


def _same_tables(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.glob("*.parquet"))
    assert names == sorted(p.name for p in b.glob("*.parquet")) and "requests.parquet" in names
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), f"{name} differs"
    assert not [p.name for p in b.iterdir() if p.name.startswith(".")]  # the engine's work folder is gone


def _summary(run: Path) -> dict:
    s = json.loads((run / "manifest.json").read_text())["analyze"]["summary"]
    for k in ENGINE_DEPENDENT:
        s.pop(k)
    stats = s["input"].pop("tokenizer_stats")
    return s | {"_stats": stats}


@needs_ray
@pytest.mark.usefixtures("ray_cluster")
def test_ray_engine_writes_the_local_tables(tmp_path: Path) -> None:
    inputs = (str(_log(tmp_path / "log.jsonl")), str(_otlp(tmp_path / "otlp.jsonl")),
              str(ROOT / "sample_logs" / "chat.parquet"))
    local = run_analysis(AnalyzeConfig(inputs=inputs, output=str(tmp_path / "local")))
    ray_run = run_analysis(AnalyzeConfig(inputs=inputs, output=str(tmp_path / "ray"), engine="ray", workers=2))
    _same_tables(Path(local.run_dir), Path(ray_run.run_dir))
    a, b = _summary(Path(local.run_dir)), _summary(Path(ray_run.run_dir))
    sa, sb = a.pop("_stats"), b.pop("_stats")
    assert a == b  # everything but the work counters
    assert sb["engine"] == "ray" and sb["ray_encode_workers"] == 2 and sb["encoded_on_driver"] == 0
    assert sb["ray_encoded"] == local.summary["requests"]["accepted"]  # every accepted record came from Ray
    assert b["requests"]["rejects_by_reason"] == {"invalid_json": 1, "duplicate_id": 2}
    assert sa["memo_rule"] == sb["memo_rule"]


@needs_ray
@pytest.mark.usefixtures("ray_cluster", "tiny_chunks")
def test_ray_engine_streams_in_chunks(tmp_path: Path) -> None:
    """`--stream` with tiny chunks: the driver takes the cluster's encodings chunk by chunk (a forward
    cursor over the partition files), to the local streamed run's tables; a log out of time order falls
    back to one chunk on the encodings already made, as the local path does."""
    inputs = (str(_log(tmp_path / "log.jsonl")), str(_otlp(tmp_path / "otlp.jsonl")),
              str(ROOT / "sample_logs" / "chat.parquet"))
    ordered = (str(_chat_log(tmp_path / "ordered.jsonl")),)
    shuffled = (str(_chat_log(tmp_path / "shuffled.jsonl", shuffle=3)),)
    for name, ins in (("mixed", inputs), ("ordered", ordered), ("shuffled", shuffled)):
        local = run_analysis(AnalyzeConfig(inputs=ins, output=str(tmp_path / f"local-{name}"), streaming=True))
        ray_run = run_analysis(AnalyzeConfig(inputs=ins, output=str(tmp_path / f"ray-{name}"), streaming=True,
                                             engine="ray", workers=2))
        _same_tables(Path(local.run_dir), Path(ray_run.run_dir))
        a, b = _summary(Path(local.run_dir)), _summary(Path(ray_run.run_dir))
        a.pop("_stats"), b.pop("_stats")
        assert a == b
        out_of_order = any("not in time order" in n for n in b["notes"])
        assert name == "mixed" or out_of_order == (name == "shuffled")
        stats = ray_run.summary["input"]["tokenizer_stats"]
        assert stats["encoded_on_driver"] == 0 and stats["ray_encoded"] == local.summary["requests"]["accepted"]


@needs_ray
@pytest.mark.usefixtures("ray_cluster", "tiny_chunks")
def test_ray_engine_with_the_reuse_sql(tmp_path: Path) -> None:
    """`--engine ray --reuse sql`, streamed in tiny chunks: the SQL, run once over the driver's spill of the
    cluster's encodings, writes the local scan's tables."""
    inputs = (str(_log(tmp_path / "log.jsonl")), str(ROOT / "sample_logs" / "chat.parquet"))
    local = run_analysis(AnalyzeConfig(inputs=inputs, output=str(tmp_path / "local"), streaming=True))
    ray_run = run_analysis(AnalyzeConfig(inputs=inputs, output=str(tmp_path / "ray"), streaming=True,
                                         engine="ray", workers=2, reuse="sql", reuse_memory_limit="64MB"))
    _same_tables(Path(local.run_dir), Path(ray_run.run_dir))
    a, b = _summary(Path(local.run_dir)), _summary(Path(ray_run.run_dir))
    a.pop("_stats"), b.pop("_stats")
    assert (a.pop("reuse"), b.pop("reuse")["engine"]) == ({"engine": "scan"}, "sql")
    assert a == b
    assert ray_run.summary["input"]["tokenizer_stats"]["encoded_on_driver"] == 0


@needs_ray
@pytest.mark.skipif(not HAS_MOTO, reason=NO_MOTO)
def test_ray_engine_reads_s3_inputs(tmp_path: Path, ray_cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver and the encode actors read `s3://` objects (a local moto server): the local tables."""
    for k, v in env(ray_cluster).items():
        monkeypatch.setenv(k, v)
    d = local_inputs(tmp_path)
    upload(ray_cluster, "raylogs", {"in/chat.jsonl.gz": d / "chat.jsonl.gz", "in/chat.parquet": d / "chat.parquet"})
    local = run_analysis(AnalyzeConfig(inputs=(str(d),), output=str(tmp_path / "local"), findings=False))
    ray_run = run_analysis(AnalyzeConfig(inputs=("s3://raylogs/in/",), output=str(tmp_path / "ray"), findings=False,
                                         engine="ray", workers=2))
    same_run(Path(local.run_dir), Path(ray_run.run_dir), d, "s3://raylogs/in/")
    stats = ray_run.summary["input"]["tokenizer_stats"]
    assert stats["ray_encoded"] == local.summary["requests"]["accepted"] and stats["encoded_on_driver"] == 0


@needs_ray
def test_ray_engine_on_a_hashed_trace_needs_no_cluster(tmp_path: Path) -> None:
    """Mooncake records arrive hashed: nothing to encode (no cluster is started); the reuse SQL alone
    replaces the compiled scan."""
    inputs = (str(ROOT / "sample_logs" / "mooncake_small.jsonl"),)
    local = run_analysis(AnalyzeConfig(inputs=inputs, output=str(tmp_path / "local"), findings=False))
    ray_run = run_analysis(AnalyzeConfig(inputs=inputs, output=str(tmp_path / "ray"), findings=False, engine="ray"))
    _same_tables(Path(local.run_dir), Path(ray_run.run_dir))
    assert ray_run.summary["input"]["tokenizer_stats"]["ray_encode_workers"] == 0


def test_ray_engine_without_ray_is_a_one_line_env_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    res = CliRunner().invoke(app, ["analyze", str(ROOT / "sample_logs" / "chat.jsonl"), "--engine", "ray", "-q"])
    assert res.exit_code == 7
    assert "prefixscan[ray]" in res.output and len(res.output.strip().splitlines()) == 1


def test_engine_options_are_checked(tmp_path: Path) -> None:
    log = str(ROOT / "sample_logs" / "chat.jsonl")
    res = CliRunner().invoke(app, ["analyze", log, "--engine", "spark", "-q"])
    assert res.exit_code == 2 and "--engine must be local or ray" in res.output
    if HAS_RAY:
        res = CliRunner().invoke(app, ["analyze", log, "--engine", "ray", "--granularity", "token", "-q"])
        assert res.exit_code == 2 and "block granularity" in res.output
    help_text = CliRunner().invoke(app, ["analyze", "--help"], env={"COLUMNS": "200"}).output
    assert "--engine" in help_text and "--ray-address" in help_text


@needs_ray
@pytest.mark.usefixtures("ray_cluster")
def test_an_error_on_the_cluster_is_the_local_paths_error(tmp_path: Path) -> None:
    """A tokenizer that cannot load fails in the encode actors: the run fails with prefixscan's own error
    (one line at the CLI), not a Ray traceback, and leaves no run directory."""
    from prefixscan.errors import PrefixscanError

    cfg = AnalyzeConfig(inputs=(str(ROOT / "sample_logs" / "chat.jsonl"),), output=str(tmp_path / "run"),
                        engine="ray", workers=1, tokenizer="hf:/nonexistent/tokenizer")
    with pytest.raises(PrefixscanError) as err:
        run_analysis(cfg)
    assert "Ray" not in type(err.value).__name__ and not (tmp_path / "run").exists()
