"""Damaged files: each is one `corrupt_file` reject saying where it broke, the other files go on, the
records read before the damage count, and `--strict` makes it fatal."""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.config import AnalyzeConfig
from prefixscan.errors import RejectError
from prefixscan.pipeline.run import run_analysis
from prefixscan.read.readers import read_jsonl
from tests.conftest import ROOT

CHAT = ROOT / "sample_logs" / "chat.jsonl"
MOONCAKE = ROOT / "sample_logs" / "mooncake_small.jsonl"


def _analyze(*paths: Path, **kw: object):
    return run_analysis(AnalyzeConfig(inputs=tuple(str(p) for p in paths), quiet=True, findings=False, **kw))


def _rejects(res) -> list[dict]:
    return res.tables["rejects"].to_pylist()


def _reconciles(res) -> dict:
    req = res.summary["requests"]
    assert req["read"] == req["accepted"] + req["rejected"]
    return req


def _truncated_gz(src: Path, dst: Path, keep: float) -> Path:
    data = gzip.compress(src.read_bytes(), mtime=0)
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


@pytest.mark.parametrize("src", [CHAT, MOONCAKE], ids=["ordinary-reader", "compiled-mooncake-reader"])
def test_truncated_gzip_keeps_what_was_read_and_says_where(tmp_path: Path, src: Path) -> None:
    bad = _truncated_gz(src, tmp_path / "cut.jsonl.gz", 0.5)
    good_lines = sum(1 for _ in read_jsonl(str(bad))) - 1  # the reader's own count, less the reject
    res = _analyze(bad)
    req = _reconciles(res)
    corrupt = [r for r in _rejects(res) if r["reason"] == "corrupt_file"]
    assert len(corrupt) == 1 and corrupt[0]["source_file"] == str(bad)
    assert "gzip data broken after line" in corrupt[0]["detail"] and "byte offset" in corrupt[0]["detail"]
    assert req["read"] == good_lines + 1 and req["accepted"] >= 0.3 * sum(1 for _ in open(src))
    assert any("could not be read to its end" in n for n in res.summary["notes"])


def test_both_mooncake_readers_agree_on_a_truncated_gzip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import prefixscan.pipeline.config as ingest_mod

    bad = _truncated_gz(MOONCAKE, tmp_path / "cut.jsonl.gz", 0.37)
    fast = _analyze(bad).summary["requests"]
    monkeypatch.setattr(ingest_mod, "FAST_MOONCAKE", False)
    slow = _analyze(bad).summary["requests"]
    assert fast == slow


def test_every_kind_of_damaged_file_is_a_reject_and_the_others_go_on(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.jsonl.gz"
    garbage.write_bytes(b"\x1f\x8b" + b"not really gzip at all" * 10)
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    footer = tmp_path / "footer.parquet"
    data = (ROOT / "sample_logs" / "chat.parquet").read_bytes()
    footer.write_bytes(data[:-8] + b"\xff\xff\xff\x7f" + b"PAR1")  # a footer length beyond the file
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])  # no footer at all
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"messages": "\xff\xfe"}\n\x00\x01\x02\n')
    res = _analyze(CHAT, garbage, empty, footer, cut, binary)
    req = _reconciles(res)
    assert req["accepted"] == 400  # the good file in full
    by_file = {}
    for r in _rejects(res):
        by_file.setdefault(Path(r["source_file"]).name, []).append(r["reason"])
    assert by_file["garbage.jsonl.gz"] == ["corrupt_file"]
    for name in ("empty.parquet", "footer.parquet", "cut.parquet"):
        assert by_file[name] == ["corrupt_file"], name
    assert set(by_file["binary.jsonl"]) <= {"invalid_utf8", "invalid_json"} and len(by_file["binary.jsonl"]) == 2


def test_a_damaged_row_group_is_skipped_and_the_next_ones_read(tmp_path: Path) -> None:
    rows = pa.Table.from_pylist([{"request_id": f"r{i}", "timestamp": 1_700_000_000 + i,
                                  "prompt_token_ids": list(range(i % 7, i % 7 + 40))} for i in range(300)])
    path = tmp_path / "groups.parquet"
    pq.write_table(rows, path, row_group_size=100, compression="none")
    meta = pq.ParquetFile(path).metadata
    col = meta.row_group(1).column(2)  # the token ids of the second group
    raw = bytearray(path.read_bytes())
    start = col.data_page_offset
    raw[start:start + 64] = b"\xff" * 64
    path.write_bytes(bytes(raw))
    res = _analyze(path)
    req = _reconciles(res)
    corrupt = [r for r in _rejects(res) if r["reason"] == "corrupt_file"]
    assert len(corrupt) == 1 and "row group 1 (rows 101-200)" in corrupt[0]["detail"]
    assert req["accepted"] == 200 and req["read"] == 201
    assert res.tables["requests"].column("source_line").to_pylist()[-1] == 300  # later groups keep numbers


def test_strict_makes_a_damaged_file_fatal(tmp_path: Path) -> None:
    bad = _truncated_gz(CHAT, tmp_path / "cut.jsonl.gz", 0.5)
    with pytest.raises(RejectError, match="corrupt_file"):
        _analyze(bad, strict=True)
    r = CliRunner().invoke(app, ["analyze", str(bad), "--strict", "-q"])
    assert r.exit_code == RejectError.exit_code and r.stderr.count("\n") == 1 and "cut.jsonl.gz" in r.stderr


def test_nothing_accepted_exits_non_zero(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\nnot json\n')
    r = CliRunner().invoke(app, ["analyze", str(bad), "-q", "--json"])
    assert r.exit_code == 3 and "no record accepted: 2 read, 2 rejected" in r.stderr
