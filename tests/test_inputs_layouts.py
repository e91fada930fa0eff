"""JSON text layouts besides JSON lines (issue 28): a JSON array (pretty or on one line), concatenated
pretty-printed objects and CR-only line ends are read record by record, each record located by the line
where it starts (and its number, when one line holds many)."""

from __future__ import annotations

import gzip
import io
import json
import pickle
from pathlib import Path

import pytest

from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.run import run_analysis
from prefixscan.read.readers import RawError, layout, read_jsonl, split_values
from tests.conftest import chat


def _recs(n: int = 10) -> list[dict]:
    return [chat(i, f"c{i % 3}", 1 + i % 2) for i in range(n)]


def _analyze(path: Path, **kw: object):
    return run_analysis(AnalyzeConfig(inputs=(str(path),), quiet=True, findings=False, **kw))


def _write(path: Path, text: str, gz: bool = False) -> Path:
    data = text.encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


LAYOUTS = {
    "array-pretty": lambda rs: json.dumps(rs, indent=2),
    "array-one-line": lambda rs: json.dumps(rs),
    "objects-pretty": lambda rs: "\n".join(json.dumps(r, indent=2) for r in rs) + "\n",
    "objects-one-line": lambda rs: "".join(json.dumps(r) for r in rs),
    "cr-lines": lambda rs: "\r".join(json.dumps(r) for r in rs) + "\r",
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_every_layout_reads_the_records_of_json_lines(tmp_path: Path, name: str, gz: bool) -> None:
    recs = _recs()
    lines = _analyze(_write(tmp_path / "lines.jsonl", "\n".join(json.dumps(r) for r in recs) + "\n"))
    path = _write(tmp_path / ("log.json" + (".gz" if gz else "")), LAYOUTS[name](recs), gz)
    res = _analyze(path)
    assert res.summary["requests"] == {"read": 10, "accepted": 10, "rejected": 0, "rejects_by_reason": {}}
    assert res.summary["hit_rate"] == lines.summary["hit_rate"]
    assert res.tables["requests"].column("request_id").to_pylist() == [r["request_id"] for r in recs]


def test_records_are_located_by_the_line_they_start_on(tmp_path: Path) -> None:
    recs = _recs(4)
    text = json.dumps(recs, indent=2)
    starts = [i + 1 for i, ln in enumerate(text.splitlines()) if ln == "  {"]
    got = list(read_jsonl(str(_write(tmp_path / "a.json", text))))
    assert [int(line) for line, _ in got] == starts and [line.index for line, _ in got] == [1, 2, 3, 4]
    again = pickle.loads(pickle.dumps(got[1][0]))  # records go to encode workers by pickle
    assert (int(again), again.index) == (starts[1], 2)
    # one line: the same line, told apart by the record's number (also in the default request id)
    no_ids = [{k: v for k, v in r.items() if k != "request_id"} for r in recs]
    res = _analyze(_write(tmp_path / "b.json", json.dumps(no_ids)))
    assert res.summary["requests"]["accepted"] == 4
    assert res.tables["requests"].column("request_id").to_pylist() == [f"{tmp_path / 'b.json'}:1#{i}"
                                                                       for i in range(1, 5)]


def test_bad_records_inside_an_array_are_rejects_where_they_start(tmp_path: Path) -> None:
    recs = _recs(3)
    text = "[\n" + json.dumps(recs[0]) + ",\n" + '{"request_id": "x", "messages": [oops]},\n' + "42,\n" \
        + json.dumps(recs[2]) + "\n]\n"
    res = _analyze(_write(tmp_path / "a.json", text))
    rq = res.summary["requests"]
    assert rq["read"] == 4 and rq["accepted"] == 2 and rq["rejects_by_reason"] == {"invalid_json": 1,
                                                                                     "not_an_object": 1}
    rejects = {r["reason"]: r for r in res.tables["rejects"].to_pylist()}
    assert rejects["invalid_json"]["source_line"] == 3 and rejects["not_an_object"]["source_line"] == 4
    assert "record 3" in rejects["not_an_object"]["detail"]


def test_a_truncated_array_keeps_the_records_before_the_cut(tmp_path: Path) -> None:
    recs = _recs(3)
    text = json.dumps(recs, indent=2)
    cut = text[: text.index('"request_id": "r2"')]
    res = _analyze(_write(tmp_path / "cut.json", cut))
    rq = res.summary["requests"]
    assert rq["accepted"] == 2 and rq["read"] == rq["accepted"] + rq["rejected"] == 3
    after_comma = json.dumps(recs[:2], indent=2)[:-1].rstrip() + ",\n"  # cut right after a record's comma
    res = _analyze(_write(tmp_path / "cut2.json", after_comma))
    assert res.summary["requests"]["accepted"] == 2 and res.summary["requests"]["rejects_by_reason"] == {
        "corrupt_file": 1}


def test_strings_with_brackets_quotes_and_escapes_do_not_split_records() -> None:
    text = b'[{"a": "x\\\\", "b": "]}{,[\\"", "c": [1, {"d": 2}]}, {"e": "\\u005d"}, [1]\n, {"f": 1}]'
    got = [(line, n, json.loads(v)) for line, n, v in split_values(io.BytesIO(text), array=True)]
    assert got == [(1, 1, {"a": "x\\", "b": ']}{,["', "c": [1, {"d": 2}]}), (1, 2, {"e": "]"}), (1, 3, [1]),
                   (2, 4, {"f": 1})]


def test_records_larger_than_a_read_chunk_are_whole(tmp_path: Path) -> None:
    big = [dict(chat(i, "c", 1), pad="y" * 1_500_000) for i in range(3)]  # each record > the 1 MiB chunk
    got = list(read_jsonl(str(_write(tmp_path / "big.json", json.dumps(big, indent=1)))))
    assert [o["request_id"] for _, o in got] == ["r0", "r1", "r2"]


def test_pretty_objects_longer_than_the_sniffed_head_are_told_apart(tmp_path: Path) -> None:
    recs = [dict(chat(i, "c", 1), pad="z" * 100_000) for i in range(2)]  # the first object > 64 KiB
    path = _write(tmp_path / "big.json", "\n".join(json.dumps(r, indent=2) for r in recs) + "\n")
    assert layout(str(path)) == "objects"
    assert _analyze(path).summary["requests"]["accepted"] == 2


@pytest.mark.parametrize(("text", "want"), [
    ('{"a": 1}\n{"a": 2}\n', "lines"),
    ('{"a": 1}\r\n{"a": 2}\r\n', "lines"),
    ('{"a": 1}\r{"a": 2}\r', "cr-lines"),
    ('\ufeff[{"a": 1}]', "array"),
    ('{\n  "a": 1\n}\n{\n  "a": 2\n}\n', "objects"),
    ('{"a": 1, "b\n{"a": 2}\n', "lines"),  # a broken first line of JSON lines stays JSON lines (rejects say why)
    ("not json at all\n", "lines"),
])
def test_layout_is_told_by_the_first_bytes(tmp_path: Path, text: str, want: str) -> None:
    assert layout(str(_write(tmp_path / "x.json", text))) == want


def test_a_lone_pretty_object_that_is_not_a_request_is_one_reject(tmp_path: Path) -> None:
    res = run_analysis(AnalyzeConfig(inputs=(str(_write(tmp_path / "x.json", json.dumps({"data": [1, 2]}, indent=2))),),
                                     quiet=True, findings=False))
    assert res.summary["requests"] == {"read": 1, "accepted": 0, "rejected": 1,
                                       "rejects_by_reason": {"unknown_shape": 1}}
    assert not any(isinstance(o, RawError) for _, o in read_jsonl(str(tmp_path / "x.json")))
