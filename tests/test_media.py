"""Multimodal parts are hashed by content: different media never share blocks after the first media item,
equal media still share, in JSONL and Parquet (nested structs and JSON strings), and no media bytes or
URLs reach the outputs."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan import analyze
from prefixscan.read.content import content_text
from prefixscan.read.media import media_identifier, placeholder
from tests.conftest import write_jsonl

SYSTEM = "You are a careful vision assistant for ACME. " * 12
TEXT = "Describe what you see, then list every object with its colour. " * 6
PNG = [base64.b64encode(bytes([137, 80, 78, 71]) + bytes([i]) * 300).decode() for i in range(4)]


def image_url(i: int) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG[i]}", "detail": "high"}}


MEDIA = {  # media part makers per shape: each with four different items
    "data_url": image_url,
    "http_url": lambda i: {"type": "image_url", "image_url": {"url": f"https://cdn.example.com/u/{i}/cat.png"}},
    "audio": lambda i: {"type": "input_audio", "input_audio": {"data": PNG[i], "format": "wav"}},
    "file": lambda i: {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PNG[i]}",
                                                "filename": "scan.pdf"}},
    "anthropic": lambda i: {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                        "data": PNG[i]}},
}


def record(i: int, part: dict, rid: str | None = None) -> dict:
    return {"request_id": rid or f"r{i}", "timestamp": 1_700_000_000 + i, "model": "m",
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": [part, {"type": "text", "text": TEXT}]}]}


def test_identifier_is_the_content() -> None:
    assert media_identifier(image_url(0)) != media_identifier(image_url(1))
    low = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG[0]}", "detail": "low"}}
    assert media_identifier(low) == media_identifier(image_url(0))  # detail is how, not what
    # the same bytes as a data URL, a bare base64 field, or raw bytes have one id
    raw = base64.b64decode(PNG[0])
    assert media_identifier({"type": "input_audio", "input_audio": {"data": PNG[0]}}) == \
        media_identifier(image_url(0)) == media_identifier({"type": "image", "image": raw})
    # a Parquet struct column gives each part every field of the union, null where absent
    nulls = {"type": "image_url", "text": None, "image_url": {"url": image_url(0)["image_url"]["url"],
                                                               "detail": None}}
    assert media_identifier(nulls) == media_identifier(image_url(0))
    assert content_text([nulls, {"type": "text", "text": "hi", "image_url": None}]) == placeholder(image_url(0)) + "hi"


def test_placeholder_holds_no_media() -> None:
    for make in MEDIA.values():
        p = placeholder(make(2))
        assert p.startswith("<") and len(p) <= 32
        assert "example.com" not in p and PNG[2][:12] not in p


def cached(path: Path, **kw) -> list[int]:
    return _column(path, "cached_tokens", **kw)


def _column(path: Path, name: str, **kw) -> list[int]:
    res = analyze(str(path), workers=0, findings=False, **kw)
    return res.tables["requests"].column(name).to_pylist()


@pytest.mark.parametrize("shape", sorted(MEDIA))
def test_different_media_never_share_after_the_first_item(tmp_path: Path, shape: str) -> None:
    make = MEDIA[shape]
    diff = cached(write_jsonl(tmp_path / "d.jsonl", [record(i, make(i)) for i in range(4)]))
    same_log = write_jsonl(tmp_path / "s.jsonl", [record(i, make(0)) for i in range(4)])
    same, n = cached(same_log), _column(same_log, "prompt_tokens")
    head = cached(write_jsonl(tmp_path / "h.jsonl", [record(i, {"type": "text", "text": f"<{i}>"})
                                                     for i in range(4)]))
    # with different media a hit ends before the media item: no more than the system prompt's blocks
    assert diff[0] == 0 and all(0 < c <= max(head) for c in diff[1:]), (diff, head)
    # equal media: the whole prompt is shared (capped at n-1, full blocks)
    assert same[1:] == [(k - 1) // 16 * 16 for k in n[1:]] and same[1] > max(head) + 64, same


def _parquet_rows(n: int, same: bool) -> list[dict]:
    return [record(i, image_url(0 if same else i)) for i in range(n)]


def test_parquet_nested_structs_and_json_strings(tmp_path: Path) -> None:
    for same in (False, True):
        rows = _parquet_rows(4, same)
        # nested: messages as list<struct<role, content: list<struct<type, text, image_url>>>>
        nested = [{**r, "messages": [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
                                     r["messages"][1]]} for r in rows]
        pq.write_table(pa.Table.from_pylist(nested), tmp_path / "n.parquet")
        assert pa.types.is_struct(pq.read_schema(tmp_path / "n.parquet").field("messages").type.value_type)
        js = [{**r, "messages": json.dumps(r["messages"])} for r in rows]
        pq.write_table(pa.Table.from_pylist(js), tmp_path / "j.parquet")
        jl = cached(write_jsonl(tmp_path / "x.jsonl", nested))
        assert cached(tmp_path / "n.parquet") == jl == cached(tmp_path / "j.parquet"), same
        assert (min(jl[1:]) > 200) == same, jl


def test_no_media_bytes_or_urls_in_outputs(tmp_path: Path) -> None:
    recs = [record(i, MEDIA["http_url"](i % 2)) for i in range(6)] + \
           [record(6 + i, image_url(i % 2)) for i in range(6)]
    log = write_jsonl(tmp_path / "mm.jsonl", recs)
    res = analyze(str(log), output=str(tmp_path / "run"), workers=0)
    assert res.summary["input"]["tokenizer_stats"]["media_items"] == 12
    assert any("12 media items" in n for n in res.summary["notes"])  # their token counts are not the engine's
    for f in (tmp_path / "run").rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert b"cdn.example.com" not in data and PNG[0][:24].encode() not in data, f.name


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.binary(min_size=1, max_size=64), st.sampled_from(["low", "high", None]))
def test_identifier_property(a: bytes, b: bytes, detail: str | None) -> None:
    """Equal media in any of the shapes have one id; different media have different ids."""
    b64 = base64.b64encode(a).decode()
    shapes = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}", "detail": detail}},
              {"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}},
              {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
              {"type": "input_image", "image_url": f"data:image/jpeg;base64,{b64}"}]
    assert len({media_identifier(p) for p in shapes}) == 1
    other = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b).decode()}}
    assert (media_identifier(other) == media_identifier(shapes[0])) == (a == b)
