"""The compiled Mooncake reader against the ordinary per-line path: same tables, same rejects."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.pipeline import config as ingest_mod
from prefixscan.pipeline.run import analyze
from prefixscan.read.mooncake import ACCEPTED, parse_chunk
from prefixscan.read.readers import parse_line
from prefixscan.read.trace_columns import permute_csr

TABLES = ("requests", "rejects", "summaries", "prefixes", "capacity_curve")


def _odd_lines(rng: random.Random, n: int) -> list[bytes]:
    """Canonical lines mixed with every kind of line the fast reader must hand to the ordinary path."""
    out: list[bytes] = []
    t = 0
    next_id = 0
    for i in range(n):
        t += rng.randint(0, 40)
        k = rng.randint(0, 6)
        if rng.random() < 0.5 and next_id:  # share a prefix with an earlier request
            start = rng.randint(0, max(next_id - k, 0))
            ids = list(range(start, start + k))
        else:
            ids = list(range(next_id, next_id + k))
            next_id += k
        rec = {"timestamp": t, "input_length": 512 * k + rng.randint(0, 511), "output_length": rng.randint(0, 300),
               "hash_ids": ids}
        kind = rng.random()
        if kind < 0.6:
            line = json.dumps(rec, separators=(",", ":"))
        elif kind < 0.65:
            line = json.dumps(rec)  # spaces
        elif kind < 0.68:
            line = json.dumps({**rec, "request_id": f"r{i % 50}"})  # explicit ids, some duplicated
        elif kind < 0.71:
            line = json.dumps({**rec, "tenant": f"t{i % 3}", "model": "m"})
        elif kind < 0.73:
            line = json.dumps({**rec, "timestamp": t + 0.5})
        elif kind < 0.75:
            line = json.dumps({**rec, "output_length": None})
        elif kind < 0.77:
            line = json.dumps({k2: v for k2, v in rec.items() if k2 != "output_length"})
        elif kind < 0.79:
            line = json.dumps({k2: v for k2, v in rec.items() if k2 != "input_length"})
        elif kind < 0.81:
            line = json.dumps({**rec, "hash_ids": [str(x) for x in ids] or ["a"]})
        elif kind < 0.83:
            line = json.dumps({**rec, "input_length": -3})
        elif kind < 0.85:
            line = json.dumps({**rec, "timestamp": rng.randint(0, 10**6)})  # out of time order
        elif kind < 0.87:
            line = '{"timestamp": 1, "input_length": 5, "hash_ids": [1, 2'  # truncated
        elif kind < 0.88:
            line = "   "
        elif kind < 0.89:
            line = "[1, 2, 3]"
        elif kind < 0.90:
            line = json.dumps({**rec, "input_length": True})
        elif kind < 0.91:
            line = json.dumps({**rec, "hash_ids": [True]})
        elif kind < 0.92:
            line = json.dumps({**rec, "timestamp": "2026-11-29T10:00:00Z"})
        elif kind < 0.93:
            line = json.dumps({**rec, "hash_ids": [2**70]})
        elif kind < 0.94:
            line = json.dumps({**rec, "input_length": 12.0})
        elif kind < 0.95:
            line = '{"timestamp":1,"timestamp":2,"input_length":1,"hash_ids":[1]}'  # duplicate key
        elif kind < 0.96:
            line = '{"timestamp":01,"input_length":1,"hash_ids":[1]}'  # leading zero: invalid JSON
        else:
            line = json.dumps({**rec, "turn": 2, "category": "x"})
        out.append(line.encode())
    out.insert(rng.randint(0, len(out)), b"\xff\xfe not utf-8")
    return out


def _run(path: str, out: str, fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest_mod, "FAST_MOONCAKE", fast)
    analyze(path, output=out, findings=False, force=True)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("gz", [False, True])
def test_fast_reader_equals_ordinary_path(tmp_path, monkeypatch, seed: int, gz: bool) -> None:
    lines = _odd_lines(random.Random(seed), 600)
    data = b"\n".join(lines) + (b"\n" if seed % 2 else b"")
    path = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    _run(str(path), str(tmp_path / "slow"), False, monkeypatch)
    _run(str(path), str(tmp_path / "fast"), True, monkeypatch)
    for t in TABLES:
        a = pq.read_table(tmp_path / "slow" / f"{t}.parquet")
        b = pq.read_table(tmp_path / "fast" / f"{t}.parquet")
        assert a.equals(b), t
    rej = pq.read_table(tmp_path / "fast" / "rejects.parquet").to_pydict()
    req = pq.read_table(tmp_path / "fast" / "requests.parquet")
    assert rej["reason"], "the adversarial file must produce rejects"
    n_blank = sum(1 for x in lines if not x.strip())
    assert req.num_rows + len(rej["reason"]) == len(lines) - n_blank  # read = accepted + rejected


def test_small_chunks_cut_lines_anywhere(tmp_path, monkeypatch) -> None:
    """Chunk boundaries fall inside lines: the carried remainder keeps every line whole and numbered."""
    from prefixscan.read import mooncake as mooncake_fast

    lines = _odd_lines(random.Random(9), 300)
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines))
    _run(str(path), str(tmp_path / "a"), True, monkeypatch)
    monkeypatch.setattr(mooncake_fast, "CHUNK_BYTES", 97)
    _run(str(path), str(tmp_path / "b"), True, monkeypatch)
    for t in ("requests", "rejects"):
        assert pq.read_table(tmp_path / "a" / f"{t}.parquet").equals(pq.read_table(tmp_path / "b" / f"{t}.parquet"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list(b' {}[]:,"-.0123456789eEnul\\tx\r')), max_size=60).map(bytes))
def test_kernel_accepts_only_what_orjson_reads_the_same(raw: bytes) -> None:
    """Random byte soup around the grammar: whatever the kernel accepts, orjson parses to the same values."""
    for line in (raw, b'{"timestamp":1,"input_length":2,"hash_ids":[' + raw + b"]}",
                 b'{"timestamp":' + raw + b',"input_length":2,"hash_ids":[]}'):
        c = parse_chunk(line.replace(b"\n", b" "), 1)
        if len(c.line) == 0:
            continue
        obj = parse_line(line)
        assert isinstance(obj, dict)
        assert set(obj) <= {"timestamp", "input_length", "output_length", "hash_ids"}
        assert obj["timestamp"] == int(c.timestamp_ms[0]) and not isinstance(obj["timestamp"], (bool, float))
        assert obj["input_length"] == int(c.input_length[0])
        assert obj.get("output_length") == (None if c.output_length[0] < 0 else int(c.output_length[0]))
        assert obj["hash_ids"] == c.ids.tolist()


def test_kernel_statuses() -> None:
    c = parse_chunk(b'{"timestamp":5,"input_length":9,"hash_ids":[3,4]}\n\n{"x":1}', 10)
    assert c.line.tolist() == [10] and c.ids.tolist() == [3, 4] and c.non_blank == 2
    assert [ln for ln, _ in c.slow] == [12]
    assert ACCEPTED == 0


def test_permute_csr() -> None:
    offsets = np.array([0, 2, 2, 5])
    flat = np.array([1, 2, 3, 4, 5], dtype=np.uint64)
    off, fl = permute_csr(offsets, flat, np.array([2, 0, 1]))
    assert off.tolist() == [0, 3, 5, 5] and fl.tolist() == [3, 4, 5, 1, 2]
