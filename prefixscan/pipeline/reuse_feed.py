"""How Batches reach the reuse stage: its RequestStream fed by one background thread beside the ingest.

During the ingest the main process is the critical path (it reads, parses, feeds the detector and encodes
a share of the records), while most of the reuse stage's time is compiled kernels and polars/pyarrow that
release the GIL. So the encode stage's sink (`Feeding.feed`) puts each Batch on a queue of one and a
thread (`prefixscan-reuse`) feeds them to the stream in order; nothing else touches the stream until
that thread has ended. What the thread raised is raised in the run's thread at the next Batch or at
`end`, as the stream itself would have raised it there.

A log taken as one chunk is reused as it arrives too: the encode stage hands over its text in Batches of
ONE_CHUNK_TEXT_ROWS (`ingest(text_chunks=True)`) and a one-chunk stream (its capacity input held in memory)
takes them like a streamed log's. If a Batch goes back in time further than one chunk (`OutOfOrder`),
that speculative stream is dropped at once and `end` feeds the Batches, kept meanwhile (the one-chunk
path holds the whole log in memory anyway), to a fresh stream as one Batch: the bytes of the one-chunk
path either way, without reading or encoding anything again. A one-chunk trace still comes as one Batch,
fed in the run's thread (an interrupt then stops it at once, as before).
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from prefixscan import memory
from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.config import OutOfOrder
from prefixscan.pipeline.encode import Batch
from prefixscan.pipeline.write import writing

if TYPE_CHECKING:  # imported with the stream, at the first Batch: the reading starts without polars and numba
    from prefixscan.pipeline.reuse import RequestStream

QUEUE_DEPTH = 1  # Batches waiting for the thread (one more is being fed, one more being built)
# A one-chunk log's text reused as it comes (tests switch this off to compare with the one-Batch order).
SPECULATE = True


class Feeding:
    """The reuse stage's stream (with its requests table `tmp` and spill directory) and the sink that feeds it.

    `background`: through the thread (not for the Ray engine, whose ingest catches `OutOfOrder` itself;
    not for a log that comes as one Batch, where the thread would only be waited for). `one_chunk` with
    `background` and the scan at block granularity: speculative, as above (`text_chunks`)."""

    def __init__(self, cfg: AnalyzeConfig, work: Path, one_chunk: bool, background: bool = True) -> None:
        self.cfg, self.work = cfg, work
        self.text_chunks = (SPECULATE and one_chunk and background and cfg.granularity == "block"
                            and cfg.reuse == "scan")
        self.one_chunk = one_chunk
        self.tmp, self.spill = _new_files(work)
        self._stream: RequestStream | None = None  # built at the first Batch (`stream`)
        self.kept: list[Batch] | None = [] if self.text_chunks else None  # for the fallback to one Batch
        self.disorder: OutOfOrder | None = None  # the speculative stream went back in time (and was dropped)
        self._thread = _Thread(self._feed) if background and (self.text_chunks or not one_chunk) else None

    @property
    def stream(self) -> RequestStream:
        """The stream, built when first needed: the encode stage reads and hands out its first records
        before the reuse stage (polars, numba) is imported."""
        if self._stream is None:
            self._stream = stream_class(self.cfg)(self.cfg, Path(self.tmp), self.spill, one_chunk=self.one_chunk)
        return self._stream

    def feed(self, batch: Batch) -> None:
        """The encode stage's sink (run's thread)."""
        if self.kept is not None:  # the reuse stage rebinds the Batch's lists and may rewrite its columns dict
            self.kept.append(replace(batch, cols=dict(batch.cols)))
        if self._thread is None or (self.text_chunks and batch.frame is not None):
            self._feed(batch)  # a one-chunk trace is one Batch (never mixed with text): no thread to wait for
        elif self.disorder is None:
            self._thread.put(batch)

    def _feed(self, batch: Batch) -> None:
        """One Batch into the stream (in the reuse thread when there is one)."""
        with writing(self.work):
            if self.disorder is not None:
                return
            try:
                self.stream.feed(batch)
            except OutOfOrder as exc:
                if not self.text_chunks:
                    raise
                self.disorder = exc
                self._drop()
                return
            if batch.last and self._thread is not None:  # while the encode stage stops its workers
                self.stream.drain()

    def _drop(self) -> None:
        """The speculative stream and its files go at once (their memory with them); a fresh one-chunk stream
        takes the kept Batches at the end."""
        discard(self.stream, self.tmp, self.spill)
        self.stream.ideal.release()
        self.tmp, self.spill = _new_files(self.work)
        self._stream = None  # the fresh one is a one-chunk stream too
        memory.trim()

    def end(self) -> RequestStream:
        """Once the ingest is done: every Batch fed (what the thread raised, raised), and after a speculative
        stream went back in time, the whole log as one Batch to the fresh stream."""
        kept, self.kept = self.kept, None
        if self._thread is not None:
            self._thread.finish()
        if self.disorder is not None and kept:
            whole = join_batches(kept)
            kept.clear()  # the joined lists alone hold the records: the stream lets them go once framed
            with writing(self.work):
                self.stream.feed(whole)
        return self.stream

    def abort(self, exc: BaseException) -> BaseException:
        """The run's thread failed with `exc`: the thread ended, and what to raise. An Exception waits for the
        Batches already handed over, and what the thread raised on one of them wins (the stream would have
        raised it first); an interrupt drops them."""
        self.kept = None
        if self._thread is None:
            return exc
        err = self._thread.stop(drop=not isinstance(exc, Exception))
        return err if err is not None else exc

    def discard(self, table: bool) -> None:
        """Close and remove the stream's working files (`table`: the requests table too)."""
        discard(self._stream, self.tmp if table else None, self.spill)


class _Thread:
    """One thread calling `feed` on the Batches put on a bounded queue, in order; the first error stops it."""

    def __init__(self, feed: Callable[[Batch], None]) -> None:
        self.feed = feed
        self.queue: queue.Queue[Batch | None] = queue.Queue(maxsize=QUEUE_DEPTH)
        self.error: BaseException | None = None
        self.drop = False
        self.thread: threading.Thread | None = threading.Thread(target=self._run, name="prefixscan-reuse",
                                                                daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (batch := self.queue.get()) is not None:
            if self.error is not None or self.drop:
                continue  # taken off the queue so the run's thread never blocks on it
            try:
                self.feed(batch)
            except BaseException as exc:  # raised again, as it is, in the run's thread
                self.error = exc

    def put(self, batch: Batch) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(batch)  # waits while the queue is full: memory stays bounded

    def finish(self) -> None:
        """Wait for every Batch put; raise what the thread raised."""
        self._join()
        if self.error is not None:
            raise self.error

    def stop(self, drop: bool) -> BaseException | None:
        """End the thread (`drop`: without feeding what is still queued); what it raised, if anything."""
        if self.thread is not None and drop:
            self.drop = True
            while True:
                try:
                    self.queue.get_nowait()
                except queue.Empty:
                    break
        self._join()
        return self.error

    def _join(self) -> None:
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
            self.thread = None


def join_batches(batches: list[Batch]) -> Batch:
    """Consecutive text Batches as one (the one Batch the one-chunk encode stage would have cut)."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    if any(b.frame is not None or b.tokens is not None for b in batches):
        raise ValueError("only text Batches at block granularity are joined")
    cols = {c: [v for b in batches for v in b.cols[c]] for c in first.cols}
    return Batch(first.block_size, first.hit_rule, cols=cols, hashes=[h for b in batches for h in b.hashes],
                 snippets=[s for b in batches for s in b.snippets])


def stream_class(cfg: AnalyzeConfig) -> type[RequestStream]:
    """The reuse stage: the compiled scan, or (--reuse sql) the reuse SQL run once over the whole log."""
    if cfg.reuse == "sql":
        from prefixscan.pipeline.reuse_sql_stream import SqlRequestStream

        return SqlRequestStream
    from prefixscan.pipeline.reuse import RequestStream

    return RequestStream


def _new_files(work: Path) -> tuple[str, str]:
    """A new temporary file in `work` for a stream's requests table, and a new directory for its spills."""
    fd, tmp = tempfile.mkstemp(dir=work, prefix=".requests.", suffix=".tmp")
    os.close(fd)
    return tmp, tempfile.mkdtemp(dir=work, prefix=".spill.")


def discard(stream: RequestStream | None, tmp: str | None, spill: str) -> None:
    """Close the stream's files and remove its spills (and, given `tmp`, its requests table); `stream` is
    None when no Batch came (none was built)."""
    if stream is not None:
        if stream.capacity is not None:
            stream.capacity.close()
        for kept in (stream.source, stream.deepest, stream.blocks):
            kept.f.close()
    shutil.rmtree(spill, ignore_errors=True)
    if tmp is not None and os.path.exists(tmp):
        if stream is not None:
            stream.out.abandon()
        os.remove(tmp)
