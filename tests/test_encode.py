"""Encode workers (prefixscan/encode.py): the same bytes out whatever the number of processes, rejects in
input order, failures reported, and the transport (text interning, shared hash parts) exact."""

from __future__ import annotations

import filecmp
import json
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import prefixscan.encode.encoder as enc_mod
import prefixscan.pipeline.config as ingest_mod
import prefixscan.pipeline.encode_pool as pool_mod
import prefixscan.pipeline.encode_wire as wire_mod
from prefixscan.config import AnalyzeConfig
from prefixscan.encode.hashing import ChainCache, block_hashes
from prefixscan.errors import RejectError, UsageError
from prefixscan.pipeline.run import run_analysis
from prefixscan.read.record import Record
from tests.conftest import ROOT, chat, write_jsonl


def _log(path: Path) -> Path:
    """Multi-turn chats over tenants, with lines that fail to parse and records that fail to encode."""
    recs: list = []
    i = 0
    for turn in range(1, 6):
        for conv, tenant in (("c1", "acme"), ("c2", "acme"), ("c3", "globex"), ("c4", None), ("c5", "globex")):
            recs.append(chat(i, conv, turn, tenant=tenant, ts=float(i // 4)))
            i += 1
            if i % 7 == 0:
                recs.append({"request_id": f"bad{i}", "timestamp": 1_700_000_000 + i // 4, "token_ids": [-1, 5]})
            if i % 9 == 0:
                recs.append("{not json")
    recs.append(chat(0, "c9", 1))  # a duplicate id
    return write_jsonl(path, recs)


def _run(tmp: Path, name: str, inputs: list[str], **opts: object):
    return run_analysis(AnalyzeConfig(inputs=tuple(inputs), output=str(tmp / name), **opts))


def _same_tables(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.glob("*.parquet"))
    assert names and names == sorted(p.name for p in b.glob("*.parquet"))
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), f"{name} differs"
    sa, sb = (json.loads((p / "manifest.json").read_text())["analyze"]["summary"] for p in (a, b))
    for s in (sa, sb):
        s.pop("timings")
        s["input"].pop("tokenizer_stats")  # work counters: which process tokenised what
    assert sa == sb


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest_mod, "BATCH", 3)  # many jobs in flight, split across processes
    monkeypatch.setattr(ingest_mod, "POOL_BATCH", 3)


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("streaming", [False, True])
def test_workers_give_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streaming: bool) -> None:
    log = str(_log(tmp_path / "chat.jsonl"))
    base = _run(tmp_path, "w0", [log], workers=0, streaming=streaming)
    assert base.summary["requests"]["rejected"] >= 5
    # half the conversations encoded here, the rest split over two workers (the share is held still)
    monkeypatch.setattr(pool_mod, "INITIAL_SHARE", 0.5)
    monkeypatch.setattr(pool_mod, "SHARE_STEP", 0.0)
    two = _run(tmp_path, "w2", [log], workers=2, streaming=streaming)
    stats = two.summary["input"]["tokenizer_stats"]
    assert stats["encode_workers"] == 2 and 0 < stats["encoded_in_main"]
    _same_tables(Path(base.run_dir), Path(two.run_dir))
    # rejects are in input order, whichever process found them
    rej = two.tables["rejects"].to_pylist()
    assert [r["source_line"] for r in rej] == sorted(r["source_line"] for r in rej)
    assert {r["reason"] for r in rej} >= {"wrong_type", "invalid_json", "duplicate_id"}


@pytest.mark.usefixtures("small_batches")
def test_token_granularity_with_a_worker(tmp_path: Path) -> None:
    log = str(_log(tmp_path / "chat.jsonl"))
    base = _run(tmp_path, "w0", [log], workers=0, granularity="token", findings=False)
    one = _run(tmp_path, "w1", [log], workers=1, granularity="token", findings=False)
    _same_tables(Path(base.run_dir), Path(one.run_dir))


@pytest.mark.usefixtures("small_batches")
def test_one_worker_on_the_sample_chat_log(tmp_path: Path) -> None:
    log = str(ROOT / "sample_logs" / "chat.jsonl")
    base = _run(tmp_path, "w0", [log], workers=0)
    one = _run(tmp_path, "w1", [log], workers=1)
    _same_tables(Path(base.run_dir), Path(one.run_dir))
    assert one.summary["input"]["tokenizer_stats"]["peak_rss_mib_workers"] > 0


@pytest.mark.parametrize("pool_batch", [3, 256])
def test_strict_reports_the_first_bad_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            pool_batch: int) -> None:
    monkeypatch.setattr(ingest_mod, "BATCH", pool_batch)
    monkeypatch.setattr(ingest_mod, "POOL_BATCH", pool_batch)
    recs = [chat(i, f"c{i}", 2) for i in range(6)]
    recs.insert(2, {"request_id": "neg", "timestamp": 1_700_000_000, "token_ids": [-1]})  # fails to encode
    recs.insert(5, "{not json")  # fails to parse, later in the file
    log = str(write_jsonl(tmp_path / "s.jsonl", recs))
    for workers in (0, 1):
        with pytest.raises(RejectError, match=r"s\.jsonl:3: wrong_type"):
            run_analysis(AnalyzeConfig(inputs=(log,), strict=True, workers=workers))


def test_a_worker_error_comes_back_as_the_same_error(tmp_path: Path) -> None:
    log = str(write_jsonl(tmp_path / "c.jsonl", [chat(0, "c", 1)]))
    for workers in (0, 1):
        with pytest.raises(UsageError, match="unknown tokenizer"):
            run_analysis(AnalyzeConfig(inputs=(log,), tokenizer="bogus:x", workers=workers))


def test_a_dead_worker_is_a_clear_error() -> None:
    cfg = AnalyzeConfig(inputs=())
    with pool_mod.EncodePool(cfg, False, 1, enc_mod.RecordEncoder(cfg, False)) as pool:
        pool._procs[0].kill()
        pool._procs[0].join()
        pool.submit("encode", [Record("x", 1, "r1", 0.0, "chat", messages=[{"role": "user", "content": "hi"}])])
        with pytest.raises(pool_mod.WorkerFailed, match="--workers 0"):
            pool.collect()


def test_auto_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = AnalyzeConfig(inputs=())
    monkeypatch.setattr(enc_mod, "available_cores", lambda: 2)
    assert enc_mod.auto_workers(cfg, enc_mod.POOL_MIN_BYTES - 1) == 0
    assert enc_mod.auto_workers(cfg, enc_mod.POOL_MIN_BYTES) == 1
    monkeypatch.setattr(enc_mod, "available_cores", lambda: 64)
    assert enc_mod.auto_workers(cfg, 10 * enc_mod.POOL_MIN_BYTES) == 10  # one per POOL_MIN_BYTES of input
    assert enc_mod.auto_workers(cfg, 100 * enc_mod.POOL_MIN_BYTES) == 63  # one per spare core, no fixed cap
    monkeypatch.setattr(enc_mod, "available_cores", lambda: 1)
    assert enc_mod.auto_workers(cfg, 10 * enc_mod.POOL_MIN_BYTES) == 0
    assert enc_mod.auto_workers(AnalyzeConfig(inputs=(), workers=3), 0) == 3


def test_cli_workers_flag(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prefixscan.cli.app import app

    log = str(write_jsonl(tmp_path / "c.jsonl", [chat(i, "c", i % 3 + 1) for i in range(8)]))
    r = CliRunner().invoke(app, ["analyze", log, "-o", str(tmp_path / "run"), "-q", "--workers", "1"])
    assert r.exit_code == 0, r.output
    stats = json.loads((tmp_path / "run" / "manifest.json").read_text())["analyze"]["summary"]["input"]
    assert stats["tokenizer_stats"]["encode_workers"] == 1
    r = CliRunner().invoke(app, ["analyze", log, "--workers", "-1"])
    assert r.exit_code == 2 and "greater than or equal to 0" in " ".join(r.output.split())


# ---------------------------------------------------------------- transport

texts = st.sampled_from(["short", "x" * 70, "y" * 90, "z" * 200, "shared system prompt " * 5, "é" * 80])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(texts, min_size=1, max_size=5), min_size=1, max_size=40),
       st.integers(min_value=64, max_value=600))
def test_packed_records_unpack_to_the_same(convs: list, budget: int) -> None:
    old = wire_mod.INTERN_BYTES
    wire_mod.INTERN_BYTES = budget  # a tiny shared budget: evictions on both ends
    try:
        packer, unpacker = wire_mod.Packer(), wire_mod.Unpacker()
    finally:
        wire_mod.INTERN_BYTES = old
    sent = 0
    for i, contents in enumerate(convs):
        r = Record("f", i, f"r{i}", 0.0, "chat", messages=[{"role": "user", "content": c} for c in contents])
        wire = pickle.dumps(packer.pack(r))
        sent += len(wire)
        assert unpacker.unpack(pickle.loads(wire)) == r
        assert r.messages[0]["content"] == contents[0]  # the original is not touched


def test_shipped_hash_parts_keep_their_sharing() -> None:
    rng = np.random.default_rng(1)
    chains, shipper, receiver = ChainCache(), wire_mod.Shipper(), wire_mod.Receiver()
    toks = rng.integers(0, 50_000, 16 * 40, dtype=np.uint32)
    sizes = 0
    for turn in range(1, 6):  # a conversation: each turn resends the last one's tokens and adds some
        n = 16 * 8 * turn
        keys = [bytes([k]) * 16 for k in range(turn)]
        parts = chains.segments(toks[:n], 16, 7, keys, [128] * turn, list(range(turn)))
        shipped = pickle.loads(pickle.dumps(shipper.ship(parts)))
        sizes += sum(a.nbytes for _, a, _ in shipped if a is not None)
        got = receiver.parts(shipped)
        assert np.array_equal(np.concatenate(got), block_hashes(toks[:n], 16, 7))
    assert sizes == 8 * 8 * 5  # every hash crossed once: later turns referred to earlier arrays


def test_merge_stats_sums_counters() -> None:
    got = enc_mod.merge_stats([{"a": 1, "t": 0.5, "r": None, "b": True}, {"a": 2, "t": 0.25, "r": "why"}])
    assert got == {"a": 3, "t": 0.75, "r": "why", "b": True}


def test_pin_hash_keeps_a_conversation_together() -> None:
    a = Record("f", 1, "a", 0.0, "chat", conversation_id="c", tenant="t", messages=[{"role": "user", "content": "1"}])
    b = Record("f", 2, "b", 0.0, "chat", conversation_id="c", tenant="t", messages=[{"role": "user", "content": "2"}])
    assert enc_mod.pin_hash(a) == enc_mod.pin_hash(b)
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    c = Record("f", 3, "c", 0.0, "chat", messages=first)
    d = Record("f", 4, "d", 0.0, "chat", messages=[*first, {"role": "assistant", "content": "a"},
                                                   {"role": "user", "content": "q2"}])
    assert enc_mod.pin_hash(c) == enc_mod.pin_hash(d)
    assert len({enc_mod.pin_hash(Record("f", i, str(i), 0.0, "completion", prompt=str(random.random())))
                for i in range(20)}) == 20


def test_an_unguarded_script_runs_once(tmp_path: Path) -> None:
    """A script that calls analyze at top level (no __main__ guard) must not run again in the workers."""
    log = write_jsonl(tmp_path / "c.jsonl", [chat(i, f"c{i % 3}", i % 4 + 1) for i in range(12)])
    marks = tmp_path / "marks.txt"
    script = tmp_path / "script.py"
    script.write_text(
        "import prefixscan\n"
        f"open({str(marks)!r}, 'a').write('ran\\n')\n"
        f"r = prefixscan.analyze({str(log)!r}, workers=1)\n"
        "print(r.summary['requests']['accepted'])\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "12"
    assert marks.read_text() == "ran\n"



def test_cache_budgets_are_shared_and_bounds_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    import prefixscan.encode.hashing as hashing_mod
    import prefixscan.encode.tokenize.base as base_mod

    cfg = AnalyzeConfig(inputs=())
    half = enc_mod.RecordEncoder(cfg, False, 0.5)
    half.load()
    seg = half.tokenizer.seg
    assert half.chains._d.max_bytes == hashing_mod.CHAIN_CACHE_BYTES // 2
    assert seg.memo._memo.max_bytes == base_mod.MEMO_BYTES // 2
    assert seg.pieces.max_bytes == base_mod.PIECE_CACHE_BYTES // 2
    half.share_caches(0.25)
    assert half.chains._d.max_bytes == hashing_mod.CHAIN_CACHE_BYTES // 4
    # a bound set by the caller (tests/test_memory_bounds.py sets 1 byte) is what gets shared, not replaced
    monkeypatch.setattr(hashing_mod, "CHAIN_CACHE_BYTES", 1)
    assert enc_mod.RecordEncoder(cfg, False).chains._d.max_bytes == 1


def test_detector_prework_from_a_worker_equals_its_own() -> None:
    """The detector's per-content work done in a worker (`Prework`) travels once per content and piece,
    and a detector that adopts it finds exactly what it would have computed (checks, lists, units)."""
    from prefixscan.detect.content import ContentMemo, tenant_salt
    from prefixscan.pipeline.encode_workers import Prework

    system = ("You are an assistant.\n\nDocuments:\n1. Alpha is the first.\n2. Beta is the second.\n"
              "3. Gamma is the third.\n\nAnswer briefly.")
    ask = "\n\n".join(f"Document {k}: " + "some retrieved text " * 8 for k in range(4)) + "\n\nWhich is newest?"

    def rec(i: int, conv: str, user: str, later: bool = False) -> Record:
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        if later:
            msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and now?"}]
        return Record("f", i, f"r{i}", 0.0, "chat", conversation_id=conv, tenant="acme", messages=msgs)

    pre = Prework()
    first = pre.of(rec(1, "c1", ask))
    assert first is not None
    content, pieces = first
    assert {p.key for p in pieces} == set(content.key[1:])  # the system prompt and the first user message
    assert pre.of(rec(2, "c1", ask, later=True)) is None  # the next turn resends the same early messages
    other = pre.of(rec(3, "c2", "A different question."))
    assert other is not None and len(other[1]) == 1  # the shared system prompt went once
    assert pre.of(Record("f", 4, "r4", 0.0, "completion", prompt="x")) is None

    shipped = pickle.loads(pickle.dumps(first))  # as it crosses the process boundary
    here, fresh = ContentMemo(1 << 20), ContentMemo(1 << 20)
    here.adopt(*shipped)
    r = rec(5, "c1", ask)
    salt = tenant_salt("acme")
    texts, got = here.of(r, salt)
    assert got is shipped[0]  # found, not computed again
    _, want = fresh.of(r, salt)
    assert want.checks and want.lists  # the RAG-order check and the numbered list are part of it
    for attr in ("key", "live", "checks", "lists", "cr", "nonnfc"):
        assert getattr(got, attr) == getattr(want, attr), attr
    assert here.pieces_of(got, r, texts, live=False) == shipped[1]  # the adopted pieces themselves
    assert [p.units for p in shipped[1]] == [p.units for p in fresh.pieces_of(want, r, texts, live=False)]
    # what the detector holds already is kept (its pieces carry its family votes)
    held = here.pieces.lru.get(shipped[1][0].key)
    held.votes[1] = "vote"
    here.adopt(*pickle.loads(pickle.dumps(first)))
    assert here.pieces.lru.get(held.key).votes == {1: "vote"}
