"""`prefixscan record-events`: subscribe to an engine's KV-event publisher and write what it sent.

A SUB socket takes every batch; a jump in sequence numbers is a gap (the publisher's high-water mark
dropped messages, or we joined late). With the publisher's replay endpoint (a ROUTER), a gap is asked
for again from the first missing sequence number; what replay cannot fill stays listed as a gap in the
file, so the join with a run never silently assumes events it did not see.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from prefixscan.errors import InputError, UsageError
from prefixscan.evidence.kvevents import Batch, Recording, decode, replay_batches

POLL_MS = 200


@dataclass(frozen=True)
class RecordResult:
    """What was recorded."""

    path: str
    batches: int
    events: int
    gaps: int
    missing: int
    recovered: int
    bad_messages: int
    seconds: float

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _replay(ctx, endpoint: str, start: int, timeout_s: float) -> list[Batch]:  # zmq.Context
    import zmq

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
        frames = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not sock.poll(POLL_MS):
                continue
            msg = sock.recv_multipart()
            parts = msg[1:] if msg and msg[0] == b"" else msg
            if len(parts) != 2:
                continue
            frames.append((parts[0], parts[1]))
            if int.from_bytes(parts[0], "big", signed=True) == -1:
                break
        return list(replay_batches(iter(frames)))
    finally:
        sock.close()


def _fill(rec: Recording, got: list[Batch], after: int, nxt: int) -> None:
    """Insert replayed batches inside (after, nxt) and mark the gap recovered when all arrived."""
    have = {b.seq for b in rec.batches}
    extra = [b for b in got if after < b.seq < nxt and b.seq not in have]
    rec.batches.extend(extra)
    rec.batches.sort(key=lambda b: b.seq)
    complete = {b.seq for b in rec.batches} >= set(range(after + 1, nxt))
    rec.gaps[-1] = (after, nxt, complete)


def _done(start: float, rec: Recording, duration: float | None, max_batches: int | None, idle_since: float,
          idle_timeout: float | None) -> bool:
    now = time.monotonic()
    return bool((duration is not None and now - start >= duration)
                or (max_batches is not None and len(rec.batches) >= max_batches)
                or (idle_timeout is not None and now - idle_since >= idle_timeout))


def _loop(sub, ctx, rec: Recording, replay: str | None, limits: tuple, stop: threading.Event) -> None:
    duration, max_batches, idle_timeout = limits
    start = idle_since = time.monotonic()
    while not stop.is_set() and not _done(start, rec, duration, max_batches, idle_since, idle_timeout):
        if not sub.poll(POLL_MS):
            continue
        msg = sub.recv_multipart()
        idle_since = time.monotonic()
        try:
            batch = decode(msg[-2], msg[-1]) if len(msg) >= 2 else None
        except ValueError:
            batch = None
        if batch is None:
            rec.bad_messages += 1
            continue
        before = len(rec.gaps)
        rec.add(batch)
        if replay is not None and len(rec.gaps) > before:
            after, nxt, _ = rec.gaps[-1]
            _fill(rec, _replay(ctx, replay, after + 1, 5.0), after, nxt)


def record_events(endpoint: str, output: str | os.PathLike[str], replay: str | None = None, topic: str = "",
                  duration: float | None = None, max_batches: int | None = None,
                  idle_timeout: float | None = None, force: bool = False) -> RecordResult:
    """Record until the duration, batch count or idle timeout is reached, or until interrupted (Ctrl-C).
    Nothing received is an InputError (exit 3) and writes no file."""
    import zmq

    out = Path(output)
    if out.exists() and not force:
        raise UsageError(f"{out} exists; pass --force to replace it")
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise UsageError(f"{endpoint!r} is not a ZMQ endpoint; use e.g. tcp://127.0.0.1:5557")
    ctx: zmq.Context = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        sub.connect(endpoint)
    except zmq.ZMQError as exc:
        raise InputError(f"cannot connect to {endpoint}: {exc}") from None
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    rec, stop, t0 = Recording(), threading.Event(), time.monotonic()
    old = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        _loop(sub, ctx, rec, replay, (duration, max_batches, idle_timeout), stop)
    finally:
        signal.signal(signal.SIGINT, old)
        sub.close()
    if not any(b.events for b in rec.batches):  # an empty file would read as "the engine stored nothing"
        what = (f"{len(rec.batches)} batch(es) with no event" if rec.batches else
                f"{rec.bad_messages} undecodable message(s)" if rec.bad_messages else "nothing")
        raise InputError(f"no KV events received from {endpoint} in {time.monotonic() - t0:.1f} s ({what}); "
                         "check the endpoint and that the engine publishes KV events (vLLM: kv_events_config with "
                         "enable_kv_cache_events); "
                         f"{out} was not written")
    write_recording(rec, out, {"endpoint": endpoint, "replay": replay, "topic": topic})
    missing = sum(b - a - 1 for a, b, _ in rec.gaps)
    return RecordResult(str(out), len(rec.batches), sum(len(b.events) for b in rec.batches), len(rec.gaps),
                        missing, sum(1 for *_, r in rec.gaps if r), rec.bad_messages, time.monotonic() - t0)


def write_recording(rec: Recording, out: Path, source: dict) -> None:
    """Events as Parquet; the gaps and the source go into the file's metadata (temp file, then rename)."""
    import pyarrow.parquet as pq

    events, gaps = rec.tables()
    meta = {b"prefixscan.kv_events": json.dumps({"source": source, "gaps": gaps.to_pylist(),
                                                 "bad_messages": rec.bad_messages}).encode()}
    table = events.replace_schema_metadata(meta)
    from prefixscan.run.atomic import replacing

    with replacing(out) as tmp:  # temporary name, then rename (run/atomic.py)
        pq.write_table(table, tmp, compression="zstd")
