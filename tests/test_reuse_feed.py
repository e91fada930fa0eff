"""The reuse stage beside the ingest (pipeline/reuse_feed.py): one background thread feeds the stream its
Batches, and a one-chunk log's text is reused as it comes, falling back to one Batch (kept, not re-read)
when it goes back in time. The tables are the bytes of the one-Batch order either way."""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path

import pytest

import prefixscan.pipeline.reuse_feed as feed_mod
from prefixscan.config import AnalyzeConfig
from prefixscan.errors import EnvError
from prefixscan.pipeline.encode import Batch, EncodeStage, ingest
from prefixscan.pipeline.reuse import RequestStream, _Spill
from prefixscan.pipeline.run import run_analysis
from tests.conftest import ROOT, chat, write_jsonl
from tests.test_stream import _assert_same, _chat_log, tiny_chunks  # noqa: F401  # a fixture

THREAD = "prefixscan-reuse"


def _late_log(path: Path, late: bool = True) -> Path:
    """In time order but for its last records, which go back before the first: the chunk they come in
    goes back further than one chunk."""
    recs = [chat(i, f"c{i % 4}", 1 + i // 4, tenant=("acme", "globex")[i % 2], ts=float(10 + i), user=f"u{i % 3}")
            for i in range(16 if late else 18)]
    if late:
        recs += [chat(16, "c0", 5, ts=0.0, user="u0"), chat(17, "c9", 1, tenant="globex", ts=1.0)]
    return write_jsonl(path, recs)


class _Spy:
    """Counts of what the reuse stage was fed, and on which thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.feeds: dict[int, int] = {}
        self.threads: set[str] = set()
        self.joined: list[int] = []
        self.reads = 0
        self.alive: list[RequestStream] = []
        self.drained: list[tuple[str, bool]] = []  # (thread, rows were held back)
        feed, join, batches, drain = RequestStream.feed, feed_mod.join_batches, EncodeStage.batches, RequestStream.drain

        self.discards: list[tuple[str, bool]] = []  # (thread, with the requests table)
        discard = feed_mod.discard

        def spy_discard(stream: RequestStream, tmp: str | None, spill: str) -> None:
            self.discards.append((threading.current_thread().name, tmp is not None))
            discard(stream, tmp, spill)

        def spy_drain(stream: RequestStream) -> None:
            self.drained.append((threading.current_thread().name, stream.pending is not None))
            drain(stream)

        def spy_feed(stream: RequestStream, batch: Batch) -> None:
            self.feeds[id(stream)] = self.feeds.get(id(stream), 0) + 1
            self.alive.append(stream)  # no id is used again
            self.threads.add(threading.current_thread().name)
            feed(stream, batch)

        def spy_join(kept: list[Batch]) -> Batch:
            self.joined.append(len(kept))
            return join(kept)

        def spy_batches(stage: EncodeStage, reader: object):
            self.reads += 1
            return batches(stage, reader)  # type: ignore[arg-type]

        monkeypatch.setattr(RequestStream, "feed", spy_feed)
        monkeypatch.setattr(RequestStream, "drain", spy_drain)
        monkeypatch.setattr(feed_mod, "discard", spy_discard)
        monkeypatch.setattr(feed_mod, "join_batches", spy_join)
        monkeypatch.setattr(EncodeStage, "batches", spy_batches)


def _one_chunk_runs(tmp: Path, log: Path, monkeypatch: pytest.MonkeyPatch, **opts: object) -> tuple:
    """(the one-Batch order, the speculative one, the latter's spy) of a log taken as one chunk."""
    runs, spy = [], None
    for spec in (False, True):
        monkeypatch.setattr(feed_mod, "SPECULATE", spec)
        if spec:
            spy = _Spy(monkeypatch)
        cfg = AnalyzeConfig(inputs=(str(log),), output=str(tmp / f"run-{spec}"), streaming=False, **opts)
        runs.append(run_analysis(cfg))
    return runs[0], runs[1], spy


OPTS = [{}, {"isolate_tenants": True, "hash_tenants": True, "tenant_key": "k"}, {"findings": False}]


@pytest.mark.usefixtures("tiny_chunks")
@pytest.mark.parametrize("opts", OPTS)
def test_one_chunk_log_in_order_is_reused_as_it_comes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      opts: dict) -> None:
    whole, spec, spy = _one_chunk_runs(tmp_path, _chat_log(tmp_path / "chat.jsonl"), monkeypatch, **opts)
    _assert_same(whole, spec)
    assert len(spy.feeds) == 1 and list(spy.feeds.values())[0] > 2  # one stream, fed chunk by chunk
    assert spy.threads == {THREAD} and spy.joined == [] and spy.reads == 1
    assert [t for t, _ in spy.drained] == [THREAD, "MainThread"]  # after the last Batch, then at close
    assert not any("time order" in n for n in spec.summary["notes"])


@pytest.mark.usefixtures("tiny_chunks")
def test_the_last_batch_is_not_held_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows of the last Batch (here two of 18 requests in Batches of four) are processed in the thread as
    soon as it is in (while the encode stage stops its workers), not after the ingest: close finds nothing
    held back."""
    whole, spec, spy = _one_chunk_runs(tmp_path, _late_log(tmp_path / "in_order.jsonl", late=False), monkeypatch)
    _assert_same(whole, spec)
    assert spy.drained == [(THREAD, True), ("MainThread", False)]


@pytest.mark.usefixtures("tiny_chunks")
@pytest.mark.parametrize("opts", OPTS)
@pytest.mark.parametrize("make", [_late_log, lambda p: _chat_log(p, shuffle=3)])
def test_one_chunk_log_going_back_in_time_falls_back_without_reading_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opts: dict, make: object) -> None:
    """The speculative stream meets OutOfOrder: it is dropped (no file of it is left) and the kept Batches
    go to a fresh stream as one; the log was read and encoded once, the bytes and summary are the one-Batch
    order's, and nothing says the log was out of order (a one-chunk log may be in any order)."""
    log = make(tmp_path / "late.jsonl")  # type: ignore[operator]
    whole, spec, spy = _one_chunk_runs(tmp_path, log, monkeypatch, **opts)
    _assert_same(whole, spec)  # also: no temporary or spill file of either stream is left behind
    assert spy.reads == 1 and len(spy.joined) == 1 and spy.joined[0] > 1
    fed = sorted(spy.feeds.values())
    assert len(fed) == 2 and fed[0] == 1 and fed[1] > 1  # the fresh stream took one Batch
    # the speculative stream went, with its table, in the reuse thread as soon as it met OutOfOrder
    assert spy.discards == [(THREAD, True), ("MainThread", False)]
    assert spec.summary["notes"] == whole.summary["notes"]
    assert not any("time order" in n for n in spec.summary["notes"])


@pytest.mark.usefixtures("tiny_chunks")
def test_joined_batches_are_the_one_chunk_batch(tmp_path: Path) -> None:
    """The encode stage's text chunks (`text_chunks`), joined, are the one Batch it cuts otherwise."""
    log = _chat_log(tmp_path / "chat.jsonl", shuffle=5)
    cfg = AnalyzeConfig(inputs=(str(log),))
    one: list[Batch] = []
    chunks: list[Batch] = []
    ingest(cfg, sink=one.append, one_chunk=True)
    ingest(cfg, sink=chunks.append, one_chunk=True, text_chunks=True)
    assert len(one) == 1 and len(chunks) > 2
    joined = feed_mod.join_batches(chunks)
    assert joined.cols == one[0].cols and joined.snippets == one[0].snippets
    assert [h.tolist() for h in joined.hashes] == [h.tolist() for h in one[0].hashes]


@pytest.mark.usefixtures("tiny_chunks")
@pytest.mark.parametrize("opts", [{"granularity": "token"}, {"reuse": "sql"}, {"trace": True}])
def test_token_granularity_sql_and_traces_keep_one_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         opts: dict) -> None:
    """The one-Batch path as before, fed in the run's thread: token granularity, --reuse sql, and a trace
    taken as one chunk."""
    log = ROOT / "sample_logs" / "mooncake_small.jsonl" if opts.pop("trace", False) else _chat_log(tmp_path / "c.jsonl")
    spy = _Spy(monkeypatch)
    run_analysis(AnalyzeConfig(inputs=(str(log),), output=str(tmp_path / "r"), streaming=False, **opts))
    assert list(spy.feeds.values()) == [1] and spy.threads == {"MainThread"}


def _no_thread_left() -> bool:
    return not any(t.name.startswith((THREAD, "prefixscan-requests-writer")) for t in threading.enumerate())


def _streamed(tmp_path: Path) -> AnalyzeConfig:
    return AnalyzeConfig(inputs=(str(_chat_log(tmp_path / "chat.jsonl")),), output=str(tmp_path / "run"),
                         streaming=True)


def _fail_at(monkeypatch: pytest.MonkeyPatch, flush: int, exc: BaseException, slow: float = 0.0) -> list[str]:
    """The run's thread raises `exc` reading its `flush`-th batch of records; each chunk the stream
    processes takes `slow` seconds more. Returns the threads the chunks were processed on."""
    on: list[str] = []
    process, flush_fn = RequestStream._process, EncodeStage._flush
    calls = [0]

    def slow_process(self: RequestStream, *a: object, **k: object) -> None:
        on.append(threading.current_thread().name)
        time.sleep(slow)
        process(self, *a, **k)  # type: ignore[arg-type]

    def failing_flush(self: EncodeStage, batch: list) -> None:
        calls[0] += 1
        if calls[0] == flush:
            raise exc
        flush_fn(self, batch)

    monkeypatch.setattr(RequestStream, "_process", slow_process)
    monkeypatch.setattr(EncodeStage, "_flush", failing_flush)
    return on


@pytest.mark.usefixtures("tiny_chunks")
def test_an_error_of_the_reuse_thread_is_raised_in_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk that fails in the reuse thread fails the run with that error (the sequential order's: the
    stream failed before the later read error), leaving no thread and no file."""
    on = _fail_at(monkeypatch, 4, RuntimeError("read failed"), slow=0.3)
    process = RequestStream._process

    def boom(self: RequestStream, *a: object, **k: object) -> None:
        process(self, *a, **k)  # type: ignore[arg-type]
        raise RuntimeError("reuse failed")

    monkeypatch.setattr(RequestStream, "_process", boom)
    with pytest.raises(RuntimeError, match="reuse failed"):
        run_analysis(_streamed(tmp_path))
    assert on == [THREAD]
    assert _no_thread_left()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl"]


@pytest.mark.usefixtures("tiny_chunks")
def test_a_disk_error_in_the_reuse_thread_names_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on: list[str] = []

    def full(self: _Spill, values: object) -> None:
        on.append(threading.current_thread().name)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_Spill, "append", full)
    with pytest.raises(EnvError) as err:
        run_analysis(_streamed(tmp_path))
    assert str(err.value).startswith(f"cannot write {tmp_path / 'run'}: no space left")  # the run, not its temp
    assert on == [THREAD]
    assert _no_thread_left() and sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl"]


@pytest.mark.usefixtures("tiny_chunks")
@pytest.mark.parametrize("one_chunk", [False, True])
def test_interrupt_leaves_no_thread_and_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                one_chunk: bool) -> None:
    on = _fail_at(monkeypatch, 5, KeyboardInterrupt(), slow=0.2)
    cfg = _streamed(tmp_path)
    if one_chunk:
        cfg = AnalyzeConfig(inputs=cfg.inputs, output=cfg.output, streaming=False)
    with pytest.raises(KeyboardInterrupt):
        run_analysis(cfg)
    assert on and set(on) == {THREAD}
    assert _no_thread_left()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl"]


@pytest.mark.usefixtures("tiny_chunks")
def test_the_queue_holds_few_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow reuse stage holds the ingest back: never more than the queue and the Batch being fed."""
    handed, done, most = [0], [0], [0]
    feed, put = RequestStream.feed, feed_mod.Feeding.feed

    def slow_feed(stream: RequestStream, batch: Batch) -> None:
        time.sleep(0.05)
        feed(stream, batch)
        done[0] += 1

    def count_put(self: feed_mod.Feeding, batch: Batch) -> None:
        put(self, batch)
        handed[0] += 1
        most[0] = max(most[0], handed[0] - done[0])

    monkeypatch.setattr(RequestStream, "feed", slow_feed)
    monkeypatch.setattr(feed_mod.Feeding, "feed", count_put)
    res = run_analysis(_streamed(tmp_path))
    assert done[0] == handed[0] > 3
    assert 1 < most[0] <= feed_mod.QUEUE_DEPTH + 1
    mem = run_analysis(AnalyzeConfig(inputs=res.config.inputs, output=str(tmp_path / "mem"), streaming=False))
    _assert_same(mem, res)


@pytest.mark.usefixtures("tiny_chunks")
@pytest.mark.parametrize("name", ["chat.jsonl", "chat.parquet"])
def test_sample_logs_one_chunk_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A sample chat log in Batches of 3 as they come against one Batch."""
    log = ROOT / "sample_logs" / name
    whole, spec, spy = _one_chunk_runs(tmp_path, log, monkeypatch)
    _assert_same(whole, spec)
    assert sum(spy.feeds.values()) > 2
