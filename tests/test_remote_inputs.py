"""`s3://` inputs (prefixscan.read.remote) read through pyarrow.fs, against a local moto S3 server."""

from __future__ import annotations

import filecmp
import gzip
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.config import AnalyzeConfig
from prefixscan.errors import InputError
from prefixscan.pipeline.run import run_analysis
from prefixscan.read import remote
from prefixscan.read.sources import expand
from tests.conftest import ROOT
from tests.s3_server import HAS_MOTO, NO_MOTO, env, free_port, s3_server, upload

needs_moto = pytest.mark.skipif(not HAS_MOTO, reason=NO_MOTO)


def local_inputs(tmp_path: Path) -> Path:
    """A folder of a gzip JSONL log and a Parquet log (the same files go to the bucket)."""
    d = tmp_path / "in"
    d.mkdir()
    with gzip.open(d / "chat.jsonl.gz", "wb") as f:
        f.write((ROOT / "sample_logs" / "chat.jsonl").read_bytes())
    shutil.copy(ROOT / "sample_logs" / "chat.parquet", d / "chat.parquet")
    return d


def same_run(local: Path, stored: Path, local_dir: Path, uri: str) -> None:
    """Every table equal byte for byte but the requests table, whose source_file names the object."""
    for p in sorted(local.glob("*.parquet")):
        if p.name != "requests.parquet":
            assert filecmp.cmp(p, stored / p.name, shallow=False), p.name
    a, b = pq.read_table(local / "requests.parquet"), pq.read_table(stored / "requests.parquet")
    files = [f.replace(str(local_dir) + "/", uri) for f in a.column("source_file").to_pylist()]
    assert files == b.column("source_file").to_pylist()
    assert a.drop(["source_file"]).equals(b.drop(["source_file"]))


@pytest.fixture(scope="module")
def s3():
    with s3_server() as endpoint:
        yield endpoint


@needs_moto
def test_s3_inputs_give_the_local_tables(tmp_path: Path, s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in env(s3).items():
        monkeypatch.setenv(k, v)
    d = local_inputs(tmp_path)
    upload(s3, "logs", {"in/chat.jsonl.gz": d / "chat.jsonl.gz", "in/chat.parquet": d / "chat.parquet"})
    srcs = expand(["s3://logs/in/"])
    assert [s.path for s in srcs] == ["s3://logs/in/chat.jsonl.gz", "s3://logs/in/chat.parquet"]
    assert [s.size for s in srcs] == [p.stat().st_size for p in sorted(d.iterdir())]
    assert [s.fingerprint for s in srcs] == [s.fingerprint for s in expand([str(d)])]
    local = run_analysis(AnalyzeConfig(inputs=(str(d),), output=str(tmp_path / "local")))
    stored = run_analysis(AnalyzeConfig(inputs=("s3://logs/in/",), output=str(tmp_path / "s3")))
    same_run(Path(local.run_dir), Path(stored.run_dir), d, "s3://logs/in/")
    assert stored.summary["requests"] == local.summary["requests"]


@needs_moto
def test_missing_objects_are_input_errors(s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in env(s3).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(InputError, match="does not exist"):
        expand(["s3://nobucket/x.jsonl"])


def test_an_unreachable_store_is_a_one_line_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens on the endpoint: exit code 3 and one line naming the URI (after the S3 client's
    retries, a few seconds)."""
    pytest.importorskip("pyarrow._s3fs", reason="pyarrow built without S3")
    for k, v in env(f"http://127.0.0.1:{free_port()}").items():
        monkeypatch.setenv(k, v)
    res = CliRunner().invoke(app, ["analyze", "s3://logs/in/chat.jsonl", "-q"])
    assert res.exit_code == 3, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "s3://logs/in/chat.jsonl" in lines[0] and "AWS_ENDPOINT_URL" in lines[0]


def test_uri_detection() -> None:
    assert remote.is_uri("s3://b/k.jsonl") and remote.is_uri("GS://b/k")
    assert not remote.is_uri("logs/s3:/x.jsonl") and not remote.is_uri("/data/chat.jsonl")
