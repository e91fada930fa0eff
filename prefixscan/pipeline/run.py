"""`analyze`: the pipeline's stages run in data-flow order, one chunk at a time (docs/pipeline.md).

read -> encode -> reuse (+ write the requests table) -> aggregate -> detect -> summary -> write. A log
taken as one chunk (small logs, token granularity, a log not in time order) goes through the same code
as a log streamed in many. Returns an AnalysisResult (tables + summary dict) and, given an output
directory, writes the run directory. Reporters render the result; nothing here prints.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from prefixscan import memory, startup
from prefixscan.config import AnalyzeConfig
from prefixscan.errors import EnvError
from prefixscan.memory import peak_rss_mib
from prefixscan.pipeline import pilot as pilot_stage
from prefixscan.pipeline.config import OutOfOrder, streams, validate
from prefixscan.pipeline.encode import Ingested, ingest
from prefixscan.pipeline.encode_workers import discard_early
from prefixscan.pipeline.reuse_feed import Feeding
from prefixscan.pipeline.write import OnDisk, Tables, write_run, writing
from prefixscan.privacy import resolve_tenant_key
from prefixscan.read.sources import Source, check_output, expand
from prefixscan.run import rundir
from prefixscan.schema import REJECTS_SCHEMA

if TYPE_CHECKING:  # the stages after the encode stage (polars, numba) are imported where first used
    import polars as pl

    from prefixscan.pipeline import aggregate
    from prefixscan.pipeline.reuse import RequestStream
    from prefixscan.read.decisions import DecisionLog

Progress = Callable[[int, int, int], None]
# The capacity curve of a log held in memory runs in a background thread beside the aggregates and
# findings (tests switch this off to compare with the sequential order).
OVERLAP_CAPACITY = True


@dataclass
class AnalysisResult:
    """Everything `analyze` computed; `summary` is the stable JSON interface."""

    config: AnalyzeConfig
    summary: dict[str, Any]
    tables: dict[str, pa.Table]
    run_dir: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    findings: Any = None  # prefixscan.detect.FindingsResult (None with --no-findings)
    evidence: Any = None  # prefixscan.evidence.attach.Evidence, when --metrics/--kv-events were given

    def to_json(self) -> dict[str, Any]:
        return self.summary


def analyze(*inputs: str, output: str | None = None, **options: Any) -> AnalysisResult:
    """Python API: `prefixscan.analyze("logs/*.jsonl", output="run", tokenizer="hf:/models/llama")`."""
    return run_analysis(AnalyzeConfig(inputs=tuple(inputs), output=output, **options))


@dataclass
class Reused:
    """What the read, encode, reuse and aggregate stages leave for the rest."""

    ing: Ingested
    agg: pl.DataFrame  # the per-request hit-rate columns the summary reads (no text, no block lists)
    side: aggregate.SideStats  # the summary's other per-request statistics
    summaries: pl.DataFrame
    prefixes: pl.DataFrame
    curve: _Curve  # computed, or being computed in a background thread
    requests_path: Path  # the finished requests table (a temporary name inside the working directory)
    rows: int
    reuse: dict[str, Any]  # which reuse engine ran (the summary's `reuse`)

    @property
    def misses_path(self) -> Path:
        """Where the detect stage writes the misses table, beside the requests table, until the run takes it."""
        return self.requests_path.with_name(self.requests_path.name.replace(".requests.", ".misses.", 1))


class _Clock:
    """Seconds and peak RSS per stage (the summary's `timings`)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.t0 = self.t = time.perf_counter()

    def done(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[f"{stage}_s"] = now - self.t
        self.timings[f"peak_rss_mib_{stage}"] = peak_rss_mib()
        self.t = now


class _Curve:
    """The capacity curve: computed already, or (`start`) being computed in a background thread.

    The thread runs only compiled kernels that release the GIL (`nogil=True`, checked by
    tests/test_capacity_overlap.py) and is the only code of the run that launches numba's parallel
    kernels while it runs (OPT and the simulated pool sizes; nothing the aggregates or findings call is
    parallel), so the threading layer never sees two launches at once. It is a daemon: an interrupt
    aborts the run at once (the run directory removed as before) and the thread's result is dropped.
    """

    def __init__(self, table: pa.Table | None = None) -> None:
        self._table = table
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.seconds = self.peak_mib = self.wait_s = 0.0
        self.background = False

    @classmethod
    def start(cls, job: Callable[[], pa.Table], work: Path) -> _Curve:
        curve = cls()
        curve.background = True
        curve._thread = threading.Thread(target=curve._run, args=(job, work), name="prefixscan-capacity",
                                         daemon=True)
        curve._thread.start()
        return curve

    def _run(self, job: Callable[[], pa.Table], work: Path) -> None:
        t = time.perf_counter()
        try:
            with writing(work):
                self._table = job()
            memory.trim()
        except BaseException as exc:  # raised again, as it is, by `result` in the run's thread
            self._error = exc
        self.seconds, self.peak_mib = time.perf_counter() - t, peak_rss_mib()

    def result(self) -> pa.Table:
        """The table, once the thread is done; what the thread raised, raised again."""
        if self._thread is not None:
            t = time.perf_counter()
            self._thread.join()
            self._thread, self.wait_s = None, time.perf_counter() - t
        if self._error is not None:
            raise self._error
        return self._table

    def settle(self, exc: BaseException) -> BaseException:
        """What to raise when the run's own stages failed with `exc` while the curve was computed: the
        curve's error if it fails too (the sequential order ran it first, so that is what it raised),
        else `exc`. An interrupt (not an Exception) does not wait for the thread."""
        if self._thread is not None and isinstance(exc, Exception):
            self._thread.join()
            self._thread = None
        return self._error if self._thread is None and self._error is not None else exc


def run_analysis(cfg: AnalyzeConfig, progress: Progress | None = None) -> AnalysisResult:
    """Run the whole analysis for a config; write the run directory when `cfg.output` is set."""
    startup.let_go()  # an earlier run's held objects (the console command holds them until it exits)
    try:
        with memory.fewer_collections():  # the run's caches and columns hold no cycles
            return _run(cfg, progress)
    finally:
        discard_early()  # encode workers started early for this run that its pool did not take


def _run(cfg: AnalyzeConfig, progress: Progress | None) -> AnalysisResult:
    validate(cfg)
    if cfg.hash_tenants:  # one key for the whole run: every chunk, the findings and the summary hash alike
        cfg = replace(cfg, tenant_key=resolve_tenant_key(cfg.tenant_key))
    sources = expand(list(cfg.inputs))  # once: the read stage reads these, and their size decides chunking
    chunked = streams(cfg, sources)
    if cfg.output:
        check_output(cfg.output, cfg.inputs, sources)
    log = pilot_stage.decisions(cfg)  # before the long work: a missing file, or a bad row under --strict, fails now
    # Built beside the target and swapped in on success (fails here, before the long work, if it cannot)
    new = rundir.NewRun(cfg.output, cfg.force) if cfg.output else None
    try:
        result = _in_workdir(cfg, sources, chunked, new.path if new is not None else None, progress, log)
    except EnvError as exc:
        if new is None:
            raise
        new.abort()
        raise EnvError(str(exc).replace(str(new.path), str(new.target))) from None  # name the run, not its temp
    except BaseException:
        if new is not None:
            new.abort()
        raise
    if new is not None:
        result.run_dir = str(new.commit())
        for name, t in dict.items(result.tables):
            if isinstance(t, OnDisk):
                t.path = new.target / f"{name}.parquet"
    return result


def _in_workdir(cfg: AnalyzeConfig, sources: list[Source], chunked: bool, run_path: Path | None,
                progress: Progress | None, log: DecisionLog | None = None) -> AnalysisResult:
    """The analysis in the run being built, or (no run directory) in a scratch directory removed after."""
    scratch = None if run_path is not None else Path(tempfile.mkdtemp(prefix="prefixscan-"))
    try:
        result = _analyse(cfg, sources, chunked, run_path or scratch, run_path, progress,  # type: ignore[arg-type]
                          log)
        if scratch is not None:  # the tables on disk (requests, misses) leave the scratch directory in memory
            for name in [n for n, t in dict.items(result.tables) if isinstance(t, OnDisk)]:
                result.tables[name]  # Tables reads it on access
        return result
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _analyse(cfg: AnalyzeConfig, sources: list[Source], chunked: bool, work: Path, run_path: Path | None,
             progress: Progress | None, log: DecisionLog | None = None) -> AnalysisResult:
    clock, notes = _Clock(), []
    try:
        reused = _reuse(cfg, sources, work, progress, clock, one_chunk=not chunked)
    except OutOfOrder as exc:
        notes.append(f"The log is not in time order ({exc}); it was analysed in memory instead of streamed, "
                     "so memory grew with the whole log. Sort it by time to analyse it in bounded memory.")
        clock = _Clock()
        reused = _reuse(cfg, sources, work, progress, clock, one_chunk=True, speculate=False)
    try:
        return _finish(cfg, reused, clock, notes, run_path, log)
    except BaseException:
        # The requests and misses tables are still temporary files in the run directory: leave none behind
        # (a directory with stray files and no manifest would refuse a later --force).
        reused.requests_path.unlink(missing_ok=True)
        reused.misses_path.unlink(missing_ok=True)
        raise


def _reuse(cfg: AnalyzeConfig, sources: list[Source], work: Path, progress: Progress | None, clock: _Clock,
           one_chunk: bool, speculate: bool = True) -> Reused:
    """Read, encode, reuse and write requests in one pass over the chunks, then the capacity curve and the
    aggregates. `one_chunk`: the whole log as one chunk (held in memory, any order); `speculate`: its text
    reused chunk by chunk as it comes, unless it goes back in time (reuse_feed.py)."""
    memory.fixed_mmap_threshold()
    feeding = Feeding(cfg, work, one_chunk, background=cfg.engine != "ray" and (speculate or not one_chunk))
    curve = _Curve()  # not started yet
    try:
        if cfg.engine == "ray":  # encoded on a Ray cluster, then this one-chunk path (pipeline/ray.py)
            from prefixscan.pipeline.ray import ray_ingest

            ing = ray_ingest(cfg, progress, sources, work, sink=feeding.feed)
        else:
            ing = ingest(cfg, progress, sink=feeding.feed, sources=sources, one_chunk=one_chunk,
                         text_chunks=feeding.text_chunks)
        stream = feeding.end()
        with writing(work):
            stream.close(wait=False)  # the table's last groups are written while the capacity curve runs
        n_distinct = stream.ideal.n_distinct
        stream.ideal.release()
        memory.trim()
        clock.done("ingest")
        clock.done("reuse")  # reuse ran chunk by chunk inside the ingest
        curve = _capacity(cfg, stream, n_distinct, ing, work, clock)
        with writing(work):
            stream.out.wait()
        from prefixscan.pipeline import aggregate

        agg, side, summaries, prefixes = aggregate.aggregates(cfg, stream, Path(feeding.tmp))
        memory.trim()
        clock.done("aggregate")
    except BaseException as exc:
        err = feeding.abort(exc)  # the reuse thread ended first: then its files can go
        feeding.discard(table=True)
        err = curve.settle(err)
        if err is not exc:
            raise err from None
        raise
    feeding.discard(table=False)
    return Reused(ing, agg, side, summaries, prefixes, curve, Path(feeding.tmp), stream.seq, stream.reuse_info)


def _capacity(cfg: AnalyzeConfig, stream: RequestStream, n_distinct: int, ing: Ingested, work: Path,
              clock: _Clock) -> _Curve:
    """The capacity curve: in a background thread when its input is held in memory (a one-chunk log),
    joined where the summary first needs it; otherwise computed now, before the aggregates.

    A streamed log's capacity input is on disk and its passes hold O(distinct blocks) of state each; run
    beside the aggregates' columns, the two peaks would add up and break the bound on memory that
    streaming promises (issue 6's 2 GiB target on a 10M-request trace). So it runs alone, first. A log
    held in memory already holds its whole capacity input; the overlap adds the kernels' working arrays
    to the aggregates' columns (measured in docs/pipeline.md)."""
    from prefixscan.pipeline import aggregate

    job = aggregate.capacity_job(cfg, stream, n_distinct) if OVERLAP_CAPACITY else None
    if job is not None:
        return _Curve.start(job, work)
    curve = aggregate.capacity(cfg, stream, n_distinct, ing.block_size, ing.hit_rule, work)
    memory.trim()
    clock.done("capacity")
    return _Curve(curve)


def _finish(cfg: AnalyzeConfig, r: Reused, clock: _Clock, notes: list[str], run_path: Path | None,
            log: DecisionLog | None = None) -> AnalysisResult:
    """Findings and miss attribution (while the capacity curve may still be computed), then the summary
    and the run directory of the reused log."""
    from prefixscan.pipeline.summary import build_summary

    timings, ing = clock.timings, startup.hold(r).ing  # the console command never frees the run's memos
    try:
        fres, attribution = _detect(cfg, r, timings)
    except BaseException as exc:
        err = r.curve.settle(exc)
        if err is not exc:
            raise err from None
        raise
    rejects = pa.Table.from_pylist(ing.rejects, schema=REJECTS_SCHEMA)
    curve = _joined(r.curve, timings)
    tables = Tables({"requests": OnDisk(r.requests_path, r.rows), "rejects": rejects,
                     "summaries": r.summaries.to_arrow(), "prefixes": r.prefixes.to_arrow(), "capacity_curve": curve})
    if fres is not None:
        tables.update(fres.tables())
    tables["misses"], summary_misses = attribution
    summary = build_summary(cfg, ing, r.agg, r.summaries, r.prefixes, curve, r.side)
    summary["miss_attribution"] = summary_misses
    pilot_stage.add(r.requests_path, ing.block_size, log, tables, summary, notes)
    summary["reuse"] = r.reuse
    summary["notes"] += notes
    if fres is not None:
        summary["findings"] = fres.to_json()
        summary["counterfactual"] = fres.counterfactual.to_json()
    timings["total_s"] = time.perf_counter() - clock.t0
    summary["timings"] = {k: round(v, 3) for k, v in timings.items()}
    result = AnalysisResult(cfg, summary, tables, timings=timings, findings=fres)
    if run_path is not None:
        write_run(run_path, cfg, ing, tables, summary)
        result.run_dir = str(run_path)
    return result


def _detect(cfg: AnalyzeConfig, r: Reused, timings: dict[str, float]) -> tuple[Any, Any]:
    """(findings, miss attribution) of the requests table."""
    from prefixscan.pipeline import detect

    # Findings (issue 3): finalise the detector the encode stage fed; counterfactual re-analysis.
    fres = detect.findings(cfg, r.ing, r.agg, r.requests_path)
    timings["findings_s"] = fres.seconds if fres is not None else 0.0  # the detector's own time, fed in ingest
    timings["peak_rss_mib_findings"] = peak_rss_mib()
    t_att = time.perf_counter()
    attribution = detect.misses(r.ing, cfg, r.requests_path, fres, r.misses_path)
    timings["attribution_s"] = time.perf_counter() - t_att
    return fres, attribution


def _joined(curve: _Curve, timings: dict[str, float]) -> pa.Table:
    """The capacity curve's table; computed in the background, its own seconds and the process's peak
    when it ended go to the timings, with how long the summary waited for it."""
    table = curve.result()
    if curve.background:
        timings["capacity_s"] = curve.seconds
        timings["peak_rss_mib_capacity"] = curve.peak_mib
        timings["capacity_wait_s"] = curve.wait_s
    return table
