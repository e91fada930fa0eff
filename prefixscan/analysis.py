"""`analyze`: logs -> requests table -> ideal-cache reuse, aggregates, top prefixes, capacity curve.

Returns an AnalysisResult (tables + summary dict) and, given an output directory, writes the run
directory. Reporters render the result; nothing here prints.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan import __version__
from prefixscan.config import AnalyzeConfig
from prefixscan.errors import EnvError, UsageError
from prefixscan.ingest import Ingested, ingest
from prefixscan.io import rundir
from prefixscan.io.modes import MANIFEST_KEY as MODE_KEY
from prefixscan.io.modes import apply_mode, input_mode
from prefixscan.io.sources import Source, check_output, expand, skipped_in
from prefixscan.memory import peak_rss_mib
from prefixscan.privacy import resolve_tenant_key, scrub_command_line
from prefixscan.requests_frame import input_frame, requests_arrow, reuse_frame
from prefixscan.reuse.aggregate import by_dimension, percentiles, rates, steady_state, summaries_table
from prefixscan.reuse.capacity import capacity_curve, capacity_sampling, capacity_targets
from prefixscan.reuse.capacity_sampled import AUTO_SAMPLE_BLOCKS, auto_rate
from prefixscan.reuse.ideal import IdealStream, TokenPrefixIndex, scope_salts
from prefixscan.reuse.prefixes import prefixes_table
from prefixscan.schema import REJECTS_SCHEMA
from prefixscan.vllm_hash import check_hash_options, hash_description

SUMMARY_DIMENSIONS = {"tenant": "tenant", "model": "model", "prefix_class": "prefix_class",
                      "hit_source": "hit_source", "turn_index": "_turn_bucket", "category": "category"}


@dataclass
class AnalysisResult:
    """Everything `analyze` computed; `summary` is the stable JSON interface."""

    config: AnalyzeConfig
    summary: dict[str, Any]
    tables: dict[str, pa.Table]
    run_dir: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    findings: Any = None  # prefixscan.detect.FindingsResult (None with --no-findings)

    def to_json(self) -> dict[str, Any]:
        return self.summary


def analyze(*inputs: str, output: str | None = None, **options: Any) -> AnalysisResult:
    """Python API: `prefixscan.analyze("logs/*.jsonl", output="run", tokenizer="hf:/models/llama")`."""
    return run_analysis(AnalyzeConfig(inputs=tuple(inputs), output=output, **options))


def _validate(cfg: AnalyzeConfig) -> None:
    if cfg.block_size < 1:
        raise UsageError(f"--block-size must be >= 1, got {cfg.block_size}")
    if cfg.hash_block_size is not None and cfg.hash_block_size < 1:
        raise UsageError(f"--hash-block-size must be >= 1, got {cfg.hash_block_size}")
    if cfg.granularity not in ("block", "token"):
        raise UsageError(f"--granularity must be block or token, got {cfg.granularity!r}")
    if cfg.snippet_k < 1:
        raise UsageError(f"--snippet-k must be >= 1, got {cfg.snippet_k}")
    if cfg.capacities is not None and any(c <= 0 for c in cfg.capacities):
        raise UsageError("--capacities must be positive token counts")
    check_hash_options(cfg)
    if cfg.engine not in ("local", "ray"):
        raise UsageError(f"--engine must be local or ray, got {cfg.engine!r}")
    if cfg.engine == "ray":
        from prefixscan.distributed.engine import check

        check(cfg)


STREAM_MIN_BYTES = 256 << 20  # smaller logs are analysed in memory, where they run faster
_PACKED = {".gz": 8, ".parquet": 4}  # rough expansion of compressed inputs when judging their size


def streams(cfg: AnalyzeConfig, sources: list[Source]) -> bool:
    """Whether `analyze` streams the log (bounded memory) or holds it in memory.

    `streaming=None` (the default) streams when a run directory is written, at block granularity, and the
    input is large (STREAM_MIN_BYTES, compressed files counted at their rough expanded size): in memory,
    a log takes about 8x its JSONL size; streamed, memory grows with distinct blocks only, at some cost
    in time on small logs. Token granularity holds every prompt's tokens and cannot stream."""
    if cfg.streaming is None:
        if not cfg.output or cfg.granularity != "block" or cfg.engine != "local":
            return False
        size = sum(s.size * next((k for ext, k in _PACKED.items() if s.path.endswith(ext)), 1) for s in sources)
        return size >= STREAM_MIN_BYTES
    if cfg.streaming and not cfg.output:
        raise UsageError("streaming writes the requests table as it goes: give a run directory with -o")
    if cfg.streaming and cfg.granularity == "token":
        raise UsageError("--granularity token holds every prompt's tokens: it cannot stream; use --in-memory")
    return cfg.streaming


class _OnDisk:
    """A table already written to the run directory, read only if someone asks for it."""

    def __init__(self, path: Path, rows: int) -> None:
        self.path, self.num_rows = path, rows


class Tables(dict):
    """The result's tables by name; a streamed run's requests table is read from its Parquet file on first
    access (it is the size of the log)."""

    def __getitem__(self, name: str) -> pa.Table:
        t = super().__getitem__(name)
        if isinstance(t, _OnDisk):
            t = pq.read_table(t.path)
            self[name] = t
        return t


def run_analysis(cfg: AnalyzeConfig, progress: Callable[[int, int, int], None] | None = None) -> AnalysisResult:
    """Run the whole analysis for a config; write the run directory when `cfg.output` is set."""
    _validate(cfg)
    if cfg.hash_tenants:  # one key for the whole run: every chunk, the findings and the summary hash alike
        cfg = replace(cfg, tenant_key=resolve_tenant_key(cfg.tenant_key))
    sources = expand(list(cfg.inputs))  # once: ingest reads these, and their size decides streaming
    stream_it = streams(cfg, sources)
    if cfg.output:
        check_output(cfg.output, cfg.inputs, sources)
    # Built beside the target and swapped in on success (fails here, before the long work, if it cannot)
    new = rundir.NewRun(cfg.output, cfg.force) if cfg.output else None
    try:
        result = _analyse(cfg, sources, stream_it, new.path if new is not None else None, progress)
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
            if isinstance(t, _OnDisk):
                t.path = new.target / f"{name}.parquet"
    return result


def _analyse(cfg: AnalyzeConfig, sources: list[Source], stream_it: bool, run_path: Path | None,
             progress: Callable[[int, int, int], None] | None) -> AnalysisResult:
    """The analysis proper; a run directory's files go to `run_path` (the run being built)."""
    timings: dict[str, float] = {}

    def done(stage: str, since: float) -> float:
        """Record a stage's seconds and the peak RSS once it ended; the start of the next stage."""
        now = time.perf_counter()
        timings[f"{stage}_s"] = now - since
        timings[f"peak_rss_mib_{stage}"] = peak_rss_mib()
        return now

    t0 = time.perf_counter()
    notes: list[str] = []
    streamed = None
    if stream_it:
        from prefixscan.stream import OutOfOrder, run_stream

        try:
            streamed = run_stream(cfg, run_path, progress, done, t0, sources)  # type: ignore[arg-type]
        except OutOfOrder as exc:
            notes.append(f"The log is not in time order ({exc}); it was analysed in memory instead of streamed, "
                         "so memory grew with the whole log. Sort it by time to analyse it in bounded memory.")
            timings.clear()
            t0 = time.perf_counter()
    if streamed is not None:
        ing, req, summaries, prefixes, curve = (streamed.ing, streamed.agg, streamed.summaries,
                                                streamed.prefixes, streamed.curve)
        side: SideStats | None = streamed.side
        requests_table: Any = _OnDisk(streamed.requests_path, streamed.rows)
        freq, blocks = streamed.findings_input() if cfg.findings else (req, [])
    else:
        if cfg.engine == "ray":  # encode on a Ray cluster, reuse as SQL (prefixscan.distributed.engine)
            from prefixscan.distributed.engine import ingest_and_reuse

            ing, (req, offsets, flat, deepest, snippets, ids), t = ingest_and_reuse(cfg, progress, sources,
                                                                                    run_path, done, t0)
        else:
            ing = ingest(cfg, progress, sources=sources)
            if cfg.granularity == "token" and ing.hit_rule == "trace":
                raise UsageError("--granularity token needs token ids; hashed traces only support block granularity")
            t = done("ingest", t0)
            req, offsets, flat, deepest, snippets, ids = _reuse(cfg, ing)
        t = done("reuse", t)
        summaries = summaries_table(req, SUMMARY_DIMENSIONS)
        prefixes = prefixes_table(req, deepest, snippets, include_text=cfg.include_text, k=cfg.snippet_k)
        t = done("aggregate", t)
        curve = _capacity(cfg, ing, req, offsets, flat, ids)
        done("capacity", t)
        requests_table = requests_arrow(req, offsets, flat)
        freq, side, blocks = req, None, [(offsets, flat)]
    # Findings (issue 3): finalise the detector ingest fed; counterfactual re-analysis of rewritten requests.
    from prefixscan.detect.run import run_findings

    try:
        return _finish(cfg, ing, req, summaries, prefixes, curve, side, requests_table,
                       run_findings(cfg, ing, freq, blocks), timings, notes, t0, run_path)
    except BaseException:
        # A streamed requests table is still a temporary file in the run directory: leave none behind
        # (a directory with stray files and no manifest would refuse a later --force).
        if streamed is not None:
            streamed.requests_path.unlink(missing_ok=True)
        raise


def skipped_note(inputs: tuple[str, ...]) -> list[str]:
    """Files inside input directories that were not read (no .jsonl/.json/.ndjson/.parquet suffix)."""
    skipped = skipped_in(inputs)
    if not skipped:
        return []
    shown = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5:,} more" if len(skipped) > 5 else "")
    return [f"{len(skipped):,} file(s) in the input directories were skipped (not a known log suffix): {shown}; "
            "name them on the command line to read them."]


def input_notes(ing: Ingested, n: int) -> list[str]:
    """What the summary must say about the input's clock and its own prompt token counts."""
    out = []
    if ing.input_ordered:
        out.append(f"{ing.input_ordered:,} of {n:,} requests have no clock of their own (an OpenAI batch file, or "
                   "--order input): their order in the input is their time, one request a second; pass --rps to "
                   "`simulate` for a real arrival rate.")
    pc = ing.prompt_check
    if pc.compared and pc.differ > 0.1 * pc.compared:
        out.append(f"The log's own prompt token counts differ from prefixscan's on {pc.differ:,} of {pc.compared:,} "
                   f"requests (mean {pc.abs_diff / pc.compared:,.1f} tokens apart): the engine's tokenizer or chat "
                   "template is not the one used here; pass --tokenizer hf:<the model's directory>.")
    return out


def _finish(cfg: AnalyzeConfig, ing: Ingested, req: pl.DataFrame, summaries: pl.DataFrame, prefixes: pl.DataFrame,
            curve: pa.Table, side: SideStats | None, requests_table: Any, fres: Any, timings: dict[str, float],
            notes: list[str], t0: float, run_path: Path | None) -> AnalysisResult:
    """Tables, summary and the run directory of a finished analysis (streamed or in memory)."""
    timings["findings_s"] = fres.seconds if fres is not None else 0.0  # the detector's own time, fed in ingest
    timings["peak_rss_mib_findings"] = peak_rss_mib()
    rejects = pa.Table.from_pylist(ing.rejects, schema=REJECTS_SCHEMA)
    tables = Tables({"requests": requests_table, "rejects": rejects, "summaries": summaries.to_arrow(),
                     "prefixes": prefixes.to_arrow(), "capacity_curve": curve})
    if fres is not None:
        tables.update(fres.tables())
    from prefixscan.detect.attribution import attribute_table

    t_att = time.perf_counter()
    src = str(requests_table.path) if isinstance(requests_table, _OnDisk) else requests_table
    pc = ing.prompt_check
    attribution = attribute_table(src, ing.block_size, ing.hit_rule, fres.findings if fres is not None else [],
                                  block_granular=cfg.granularity == "block",
                                  tokenizer_mismatch=bool(pc.compared and pc.differ > 0.1 * pc.compared))
    tables["misses"] = attribution.table
    timings["attribution_s"] = time.perf_counter() - t_att
    summary = build_summary(cfg, ing, req, summaries, prefixes, curve, side)
    summary["miss_attribution"] = attribution.summary
    summary["notes"] += notes
    if fres is not None:
        summary["findings"] = fres.to_json()
        summary["counterfactual"] = fres.counterfactual.to_json()
    timings["total_s"] = time.perf_counter() - t0
    summary["timings"] = {k: round(v, 3) for k, v in timings.items()}
    result = AnalysisResult(cfg, summary, tables, timings=timings, findings=fres)
    if run_path is not None:
        for name, t in dict.items(tables):
            if isinstance(t, _OnDisk):
                os.replace(t.path, run_path / f"{name}.parquet")
                t.path = run_path / f"{name}.parquet"
            else:
                rundir.write_table(run_path, name, t)
        mode = input_mode(s.path for s in ing.sources)
        rundir.write_manifest(run_path, {**_manifest(cfg, ing, tables, summary), MODE_KEY: f"{mode:04o}"})
        apply_mode(run_path, mode)  # every file of the run as private as the least readable input
        result.run_dir = str(run_path)
    return result


def _reuse(cfg: AnalyzeConfig, ing: Ingested):  # noqa: ANN202 - internal tuple
    inp, offsets, flat, snippets, per_request, order = input_frame(cfg, ing)
    n = inp.height
    prompt = inp["prompt_tokens"].to_numpy()
    scan = IdealStream()
    res, gid = scan.add(offsets, flat, prompt, ing.block_size, ing.hit_rule,
                        scope_salts(inp["tenant"]), scope_salts(inp["conversation_id"]))
    ids = (gid, scan.n_distinct)  # the capacity curve indexes the same dense ids
    scan.release()
    cached, divergence = res.cached_tokens, res.divergence_token
    if cfg.granularity == "token":
        index = TokenPrefixIndex(ing.block_size)
        toks = [ing.tokens[i] for i in order]  # type: ignore[index]
        ns = inp["namespace"].to_list()
        lcp = np.array([index.add(toks[i], per_request[i], ns[i]) for i in range(n)], dtype=np.int64)
        divergence = lcp
        cached = np.minimum(lcp, np.maximum(prompt - 1, 0))
    rid = inp["request_id"]
    source_ids = (rid.gather(pl.Series(np.maximum(res.source, 0))).set(pl.Series(res.source < 0), None) if n
                  else pl.Series("source_request_id", [], dtype=pl.String))
    ts0 = float(inp["timestamp_s"][0]) if n else 0.0
    df, deepest = reuse_frame(inp, offsets, flat, res, cached, divergence, ing.block_size, ing.hit_rule,
                              seq0=0, ts0=ts0, source_ids=source_ids, turn_counts=None)
    return df, offsets, flat, deepest, snippets, ids


def _capacity(cfg: AnalyzeConfig, ing: Ingested, req: pl.DataFrame, offsets: np.ndarray,
              flat: np.ndarray, ids: tuple[np.ndarray, int]) -> pa.Table:
    prompt = req["prompt_tokens"].to_numpy()
    caps = list(cfg.capacities) if cfg.capacities else None
    rate = auto_rate(cfg.capacity_sample, len(flat))  # SHARDS when asked, or above the size threshold
    return capacity_curve(offsets, flat, prompt, ing.block_size, ing.hit_rule, caps, ids=ids, sample=rate)


def sampling_note(cfg: AnalyzeConfig, sampling: dict[str, Any]) -> str:
    """The summary's line on a sampled capacity curve: why, at which rate, and how wide its band is."""
    why = ("as asked (--capacity-sample)" if cfg.capacity_sample is not None else
           f"because the log lists more than {AUTO_SAMPLE_BLOCKS:,} blocks (--capacity-sample 1 forces the exact "
           "curve)")
    return (f"The capacity curve's LRU columns are sampled {why}: SHARDS at rate {sampling['rate']:g} with the "
            f"{sampling['hot_blocks']:,} hottest blocks exact, {sampling['salts']} salts; band (lru_hit_rate_low.."
            f"high) {sampling['band_mean_points']:.2f} points wide on average; OPT was not computed.")


@dataclass
class SideStats:
    """What the summary reads from columns beyond the hit-rate ones; a streamed run computes these one
    column at a time instead of holding a frame with all of them."""

    with_conversation: int  # requests that carry a conversation id
    conversations: int  # distinct conversation ids
    gaps: np.ndarray  # seconds from each hit's source request to it
    actual: pl.DataFrame  # rows with an engine-reported value: actual_cached_tokens, cached_tokens,
    # predicted_minus_actual

    @staticmethod
    def conversation_counts(conv: pl.Series) -> tuple[int, int]:
        has = int(conv.is_not_null().sum())
        return has, int(conv.n_unique() - (1 if has < len(conv) else 0)) if len(conv) else 0

    @staticmethod
    def reuse_gaps(arrival: np.ndarray, source: np.ndarray) -> np.ndarray:
        return (arrival - arrival[np.maximum(source, 0)])[source >= 0] if len(arrival) else np.zeros(0)

    @classmethod
    def of(cls, req: pl.DataFrame) -> SideStats:
        has, distinct = cls.conversation_counts(req["conversation_id"])
        return cls(has, distinct, cls.reuse_gaps(req["arrival_s"].to_numpy(), req["_source"].to_numpy()),
                   req.filter(pl.col("actual_cached_tokens").is_not_null()))


def build_summary(cfg: AnalyzeConfig, ing: Ingested, req: pl.DataFrame, summaries: pl.DataFrame,
                  prefixes: pl.DataFrame, curve: pa.Table, side: SideStats | None = None) -> dict[str, Any]:
    """The stable JSON summary (docs/analyze.md lists every key). `req` needs the hit-rate columns,
    `tenant_cached_tokens`, and (without `side`) the columns SideStats reads."""
    n = req.height
    overall = rates(req)
    steady = rates(steady_state(req))
    prompt = int(req["prompt_tokens"].sum()) if n else 0
    cached = int(req["cached_tokens"].sum()) if n else 0
    tenant_cached = int(req["tenant_cached_tokens"].sum()) if n else 0
    reasons: dict[str, int] = {}
    for r in ing.rejects:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    side = side if side is not None else SideStats.of(req)
    has_conv, distinct_conv, gaps, actual = side.with_conversation, side.conversations, side.gaps, side.actual
    notes = [f"{r['source_file']} could not be read to its end: {r['detail']} (--strict makes this fatal)"
             for r in ing.rejects if r["reason"] == "corrupt_file"]
    if n and has_conv == 0:
        notes.append("The log has no conversation id: same-conversation reuse cannot be told apart from "
                     "same-tenant reuse (none was invented). Map one with --field conversation_id=PATH.")
    elif n and ing.conversations_inferred:
        notes.append(f"{ing.conversations_inferred:,} chat requests had no conversation id: their conversations "
                     f"were inferred from message-prefix continuity ({ing.conversations_continued:,} continue an "
                     "earlier request; requests table column conversation_inferred). Map a real id with --field "
                     "conversation_id=PATH, or turn inference off with --no-infer-conversations.")
    if ing.approximate_template:
        notes.append(f"Chat prompts were rendered with prefixscan's ChatML-style template ({ing.template_version}),"
                     " an approximation of the engine's; pass --tokenizer hf:<model dir> for exact token counts.")
    notes += input_notes(ing, n) + skipped_note(cfg.inputs)
    if ing.tokenizer_stats.get("fallback_reason"):
        notes.append("Tokenisation fell back to the direct path: " + str(ing.tokenizer_stats["fallback_reason"]))
    if ing.tokenizer_stats.get("media_items"):
        notes.append(f"{ing.tokenizer_stats['media_items']:,} media items (images, audio, files) were keyed by "
                     "content and counted as a short placeholder: the model's processor expands each to its own "
                     "number of tokens, so prompt token counts of those requests are prefixscan's, not the engine's.")
    if ing.tokenizer_stats.get("vllm_lora_without_path"):
        notes.append(f"{ing.tokenizer_stats['vllm_lora_without_path']} LoRA requests had no --lora-path: vLLM hashes "
                     "the adapter's name and path, so their block hashes are not the engine's (hits are unaffected).")
    if cfg.hash != "xxh3" and {"mooncake", "bailian"} & set(ing.shapes.values()):
        notes.append(f"Hashed traces keep their own block ids: --hash {cfg.hash} applies to token and text "
                     "prompts only.")
    models = by_dimension(summaries, "model")
    if cfg.hash != "xxh3" and len(models) > 1:
        notes.append(f"{len(models)} models in one log under --hash {cfg.hash}: vLLM's hash has no model in it, so "
                     "equal token prefixes of different models count as shared; analyse one model at a time.")
    if str(ing.tokenizer_stats.get("memo_rule") or "").startswith("segments ("):
        notes.append("Tokenisation memo: " + str(ing.tokenizer_stats["memo_rule"]) + " (exact; less reuse).")
    curve_py = curve.to_pydict()
    capacity: dict[str, Any] = {}
    if curve.num_rows:
        capacity = {"points": [
            {"capacity_tokens": c, "lru_hit_rate": lr, "opt_hit_rate": o}
            for c, lr, o in zip(curve_py["capacity_tokens"], curve_py["lru_hit_rate"], curve_py["opt_hit_rate"],
                                strict=True)]}
        capacity.update(capacity_targets(curve))
        sampling = capacity_sampling(curve)
        if sampling is not None:
            capacity["sampled"] = sampling
            notes.append(sampling_note(cfg, sampling))
    cross = prefixes.filter(pl.col("cross_tenant_hits") > 0) if prefixes.height else prefixes
    return {
        "version": __version__,
        "requests": {"read": ing.read, "accepted": n, "rejected": len(ing.rejects), "rejects_by_reason": reasons},
        "tokens": {"prompt": prompt, "cached": cached, "uncached": prompt - cached,
                   "prompt_percentiles": percentiles(req["prompt_tokens"].to_numpy() if n else np.zeros(0)),
                   "cached_percentiles": percentiles(req["cached_tokens"].to_numpy() if n else np.zeros(0))},
        "hit_rate": {**overall, "steady_state_token_weighted": steady["token_weighted"],
                     "steady_state_block_weighted": steady["block_weighted"],
                     "steady_state_request_mean": steady["request_mean"],
                     "tenant_isolated_token_weighted": tenant_cached / prompt if prompt else 0.0},
        "by_tenant": by_dimension(summaries, "tenant"),
        "by_prefix_class": by_dimension(summaries, "prefix_class"),
        "by_hit_source": by_dimension(summaries, "hit_source"),
        "by_model": models,
        "by_turn": by_dimension(summaries, "turn_index"),
        "conversations": {"share_with_id": has_conv / n if n else 0.0,
                          "distinct": distinct_conv, "inferred_requests": ing.conversations_inferred,
                          "inferred_continuing": ing.conversations_continued},
        "cross_tenant": {"prefixes_shared": cross.height,
                         "tokens_lost_if_isolated": cached - tenant_cached,
                         "token_weighted_isolated": tenant_cached / prompt if prompt else 0.0},
        "reuse_gap_s": percentiles(gaps),
        "actual_vs_predicted": {
            "requests_with_actual": actual.height,
            "actual_cached": int(actual["actual_cached_tokens"].sum()) if actual.height else 0,
            "predicted_cached": int(actual["cached_tokens"].sum()) if actual.height else 0,
            "requests_short": int((actual["predicted_minus_actual"] > 0).sum()) if actual.height else 0,
        },
        "capacity": capacity,
        "input": {"files": len(ing.sources), "shapes": ing.shapes, "tokenizer": ing.tokenizer_id,
                  "template": ing.template_version, "approximate_template": ing.approximate_template,
                  "block_size": ing.block_size, "hit_rule": ing.hit_rule, "granularity": cfg.granularity,
                  "isolate_tenants": cfg.isolate_tenants, "tokenizer_stats": ing.tokenizer_stats,
                  "hash": hash_description(cfg)},
        "top_prefixes": [
            {k: r[k] for k in ("rank", "prefix_tokens", "hits", "tokens_saved", "tenants", "snippet")}
            for r in prefixes.head(5).iter_rows(named=True)],
        "notes": notes,
    }


def _manifest(cfg: AnalyzeConfig, ing: Ingested, tables: dict[str, pa.Table], summary: dict[str, Any]) -> dict:
    return {
        "tool": "prefixscan", "version": __version__,
        "command_line": scrub_command_line(cfg.command_line or shlex.join(sys.argv)),
        "config": {**replace(cfg, extras={}).to_json(), "block_size": ing.block_size, "hit_rule": ing.hit_rule,
                   "token_block_size": cfg.block_size},
        "inputs": [s.to_json() for s in ing.sources],
        "tables": {name: {"rows": t.num_rows, "stage": "analyze"} for name, t in dict.items(tables)},
        # The whole summary, so reports and later commands re-render without re-analysing.
        "analyze": {"timings": summary.get("timings", {}), "hit_rate": summary["hit_rate"],
                    "requests": summary["requests"], "summary": summary},
    }
