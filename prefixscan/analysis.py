"""`analyze`: logs -> requests table -> ideal-cache reuse, aggregates, top prefixes, capacity curve.

Returns an AnalysisResult (tables + summary dict) and, given an output directory, writes the run
directory. Reporters render the result; nothing here prints.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import xxhash

from prefixscan import __version__
from prefixscan.config import AnalyzeConfig
from prefixscan.dense import dense_ids
from prefixscan.errors import UsageError
from prefixscan.ingest import Ingested, ingest
from prefixscan.io import rundir
from prefixscan.reuse.aggregate import by_dimension, percentiles, rates, summaries_table
from prefixscan.reuse.capacity import capacity_curve, capacity_targets
from prefixscan.reuse.ideal import TokenPrefixIndex, ideal_reuse, scope_salts
from prefixscan.reuse.prefixes import prefixes_table
from prefixscan.schema import REJECTS_SCHEMA, REQUESTS_SCHEMA
from prefixscan.tracecols import permute_csr

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


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux VmHWM; 0 where /proc is absent), for the
    manifest's timings: which stage sets the peak is what a memory budget needs to know."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def _validate(cfg: AnalyzeConfig) -> None:
    if cfg.block_size < 1:
        raise UsageError(f"--block-size must be >= 1, got {cfg.block_size}")
    if cfg.hash_block_size is not None and cfg.hash_block_size < 1:
        raise UsageError(f"--hash-block-size must be >= 1, got {cfg.hash_block_size}")
    if cfg.granularity not in ("block", "token"):
        raise UsageError(f"--granularity must be block or token, got {cfg.granularity!r}")
    if cfg.capacities is not None and any(c <= 0 for c in cfg.capacities):
        raise UsageError("--capacities must be positive token counts")


def run_analysis(cfg: AnalyzeConfig, progress: Callable[[int, int, int], None] | None = None) -> AnalysisResult:
    """Run the whole analysis for a config; write the run directory when `cfg.output` is set."""
    _validate(cfg)
    if cfg.output:
        run_path = rundir.prepare(cfg.output, cfg.force)  # fail before the long work, not after
    timings: dict[str, float] = {}

    def done(stage: str, since: float) -> float:
        """Record a stage's seconds and the peak RSS once it ended; the start of the next stage."""
        now = time.perf_counter()
        timings[f"{stage}_s"] = now - since
        timings[f"peak_rss_mib_{stage}"] = peak_rss_mib()
        return now

    t0 = time.perf_counter()
    ing = ingest(cfg, progress)
    if cfg.granularity == "token" and ing.hit_rule == "trace":
        raise UsageError("--granularity token needs token ids; hashed traces only support block granularity")
    t = done("ingest", t0)
    req, offsets, flat, deepest, snippets, ids = _reuse(cfg, ing)
    t = done("reuse", t)
    summaries = summaries_table(req, SUMMARY_DIMENSIONS)
    prefixes = prefixes_table(req, deepest, snippets, include_text=cfg.include_text)
    t = done("aggregate", t)
    curve = _capacity(cfg, ing, req, offsets, flat, ids)
    done("capacity", t)
    # Findings (issue 3): finalise the detector ingest fed; counterfactual re-analysis of rewritten requests.
    from prefixscan.detect.run import run_findings

    fres = run_findings(cfg, ing, req, offsets, flat)
    timings["findings_s"] = fres.seconds if fres is not None else 0.0  # the detector's own time, fed in ingest
    timings["peak_rss_mib_findings"] = peak_rss_mib()
    requests_table = _requests_arrow(req, offsets, flat)
    rejects = pa.Table.from_pylist(ing.rejects, schema=REJECTS_SCHEMA)
    tables = {"requests": requests_table, "rejects": rejects, "summaries": summaries.to_arrow(),
              "prefixes": prefixes.to_arrow(), "capacity_curve": curve}
    if fres is not None:
        tables.update(fres.tables())
    summary = build_summary(cfg, ing, req, summaries, prefixes, curve)
    if fres is not None:
        summary["findings"] = fres.to_json()
        summary["counterfactual"] = fres.counterfactual.to_json()
    timings["total_s"] = time.perf_counter() - t0
    summary["timings"] = {k: round(v, 3) for k, v in timings.items()}
    result = AnalysisResult(cfg, summary, tables, timings=timings, findings=fres)
    if cfg.output:
        for name, t in tables.items():
            rundir.write_table(run_path, name, t)
        rundir.write_manifest(run_path, _manifest(cfg, ing, tables, summary))
        result.run_dir = str(run_path)
    return result


def _hash_tenant(t: str | None) -> str | None:
    return None if t is None else "t-" + xxhash.xxh3_64_hexdigest(t.encode())[:10]


def _columns(cfg: AnalyzeConfig, ing: Ingested):  # noqa: ANN202 - internal tuple
    """Ingest columns, block CSR and snippets in analysis order (time, then input order)."""
    if ing.frame is not None:  # hashed traces: arrays all the way
        frame, offsets, flat, snippets = ing.frame, ing.offsets, ing.flat, ing.snippets
        ing.frame, ing.offsets, ing.flat, ing.snippets = None, None, None, []
        n = frame.height
        ts = frame["timestamp_s"].to_numpy()
        order = np.lexsort((np.arange(n), ts)) if n else np.zeros(0, np.int64)
        if n and not bool((order == np.arange(n)).all()):
            frame = frame[order]
            offsets, flat = permute_csr(offsets, flat, order)
        if cfg.hash_tenants and frame["tenant"].null_count() < n:
            frame = frame.with_columns(pl.Series("tenant", [_hash_tenant(t) for t in frame["tenant"].to_list()],
                                                 dtype=pl.String))
        return {c: frame[c] for c in frame.columns}, ts, order, offsets, flat, snippets, None
    cols = ing.cols
    n = len(cols["request_id"])
    ts = np.asarray(cols["timestamp_s"], dtype=np.float64)
    order = np.lexsort((np.arange(n), ts)) if n else np.zeros(0, np.int64)  # time, then input order
    tenants = cols["tenant"]
    if cfg.hash_tenants:
        tenants = [_hash_tenant(t) for t in tenants]
    if n and bool((order == np.arange(n)).all()):  # logs are usually in time order already: no copies
        data = {c: v for c, v in cols.items() if c != "tenant"}
        data["tenant"] = tenants
        hashes, snippets = ing.hashes, ing.snippets
    else:
        data = {c: [v[i] for i in order] for c, v in cols.items() if c != "tenant"}
        data["tenant"] = [tenants[i] for i in order]
        hashes = [ing.hashes[i] for i in order]
        snippets = [ing.snippets[i] for i in order]
    # The per-request Python lists are not needed once the frame below exists: let them go.
    ing.cols, ing.hashes, ing.snippets = {}, [], []
    lengths = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(hashes) if n else np.zeros(0, np.uint64)
    per_request = hashes if cfg.granularity == "token" else None  # only token granularity needs them again
    return data, ts, order, offsets, flat, snippets, per_request


def _reuse(cfg: AnalyzeConfig, ing: Ingested):  # noqa: ANN202 - internal tuple
    data, ts, order, offsets, flat, snippets, per_request = _columns(cfg, ing)
    n = len(ts)
    lengths = np.diff(offsets)
    prompt = np.asarray(data["prompt_tokens"], dtype=np.int64)
    ids = dense_ids(flat)
    res = ideal_reuse(offsets, flat, prompt, ing.block_size, ing.hit_rule,
                      scope_salts(data["tenant"]), scope_salts(data["conversation_id"]), ids=ids)
    cached, divergence = res.cached_tokens, res.divergence_token
    if cfg.granularity == "token":
        index = TokenPrefixIndex(ing.block_size)
        toks = [ing.tokens[i] for i in order]  # type: ignore[index]
        ns = data["namespace"]
        lcp = np.array([index.add(toks[i], per_request[i], ns[i]) for i in range(n)], dtype=np.int64)
        divergence = lcp
        cached = np.minimum(lcp, np.maximum(prompt - 1, 0))
    ts_sorted = ts[order]
    df = pl.DataFrame({
        "seq": np.arange(n, dtype=np.int64),
        "request_id": data["request_id"], "source_file": data["source_file"],
        "source_line": np.asarray(data["source_line"], dtype=np.int64),
        "timestamp_s": ts_sorted, "arrival_s": ts_sorted - (ts_sorted[0] if n else 0.0),
        **{c: pl.Series(c, data[c], dtype=pl.String) for c in
           ("tenant", "conversation_id", "user", "model", "adapter", "cache_salt", "category")},
        "turn_index": pl.Series("turn_index", data["turn_index"], dtype=pl.Int32),
        "prompt_tokens": prompt,
        "head_tokens": pl.Series("head_tokens", data["head_tokens"], dtype=pl.Int64),
        "output_tokens": pl.Series("output_tokens", data["output_tokens"], dtype=pl.Int64),
        "actual_cached_tokens": pl.Series("actual_cached_tokens", data["actual_cached_tokens"], dtype=pl.Int64),
        "namespace": pl.Series("namespace", data["namespace"], dtype=pl.UInt64),
        "cached_tokens": cached, "cached_blocks": res.cached_blocks, "divergence_token": divergence,
        "conversation_cached_tokens": res.conversation_cached_tokens,
        "tenant_cached_tokens": res.tenant_cached_tokens, "_source": res.source,
        "_blocks": -(-prompt // ing.block_size) if ing.hit_rule == "vllm" else lengths,
    })
    rid = df["request_id"]
    df = df.with_columns(
        # Turn index when the log has none: position within the conversation, in time order.
        pl.when(pl.col("turn_index").is_null() & pl.col("conversation_id").is_not_null())
        .then(pl.int_range(pl.len()).over("conversation_id").cast(pl.Int32))
        .otherwise(pl.col("turn_index")).alias("turn_index"),
        rid.gather(pl.Series(np.maximum(res.source, 0))).set(pl.Series(res.source < 0), None)
        .alias("source_request_id") if n else pl.lit(None, dtype=pl.String).alias("source_request_id"),
        (pl.col("cached_tokens") // ing.block_size if ing.hit_rule == "vllm"
         else pl.col("cached_blocks").cast(pl.Int64)).alias("_hit_blocks"),
    )
    df = df.with_columns(
        pl.when(pl.col("cached_tokens") == 0).then(pl.lit("none"))
        .when(pl.col("conversation_cached_tokens") >= pl.col("cached_tokens")).then(pl.lit("same_conversation"))
        .when(pl.col("tenant_cached_tokens") >= pl.col("cached_tokens")).then(pl.lit("same_tenant"))
        .otherwise(pl.lit("other_tenant")).alias("hit_source"),
        (pl.col("cached_tokens") - pl.col("actual_cached_tokens")).alias("predicted_minus_actual"),
        pl.when(pl.col("turn_index") >= 10).then(pl.lit("10+"))
        .otherwise(pl.col("turn_index").cast(pl.String)).alias("_turn_bucket"),
    )
    block = ing.block_size
    df = df.with_columns(
        pl.when(pl.col("cached_tokens") == 0).then(pl.lit("none"))
        # The hit ends inside the system-and-tools head, or in the block that straddles its end.
        .when((pl.col("head_tokens") > 0) & (pl.col("cached_tokens") < pl.col("head_tokens") + block))
        .then(pl.lit("system_tools"))
        .when(pl.col("hit_source") == "same_conversation").then(pl.lit("conversation_history"))
        .otherwise(pl.lit("shared_document")).alias("prefix_class"),
    )
    deepest = np.zeros(n, dtype=np.uint64)
    k = res.cached_blocks
    hit = np.nonzero(k > 0)[0]
    deepest[hit] = flat[offsets[hit] + k[hit] - 1]
    return df, offsets, flat, deepest, snippets, ids


def _requests_arrow(df: pl.DataFrame, offsets: np.ndarray, flat: np.ndarray) -> pa.Table:
    names = [f.name for f in REQUESTS_SCHEMA if f.name != "block_hashes"]
    t = df.select(names).to_arrow()
    lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32) if len(flat) < 2**31 else offsets,
                                              type=pa.int32() if len(flat) < 2**31 else pa.int64()),
                                     pa.array(flat, type=pa.uint64()))
    if not pa.types.is_list(lists.type):
        lists = lists.cast(pa.list_(pa.uint64()))
    t = t.append_column("block_hashes", lists)
    return t.select([f.name for f in REQUESTS_SCHEMA]).cast(REQUESTS_SCHEMA)


def _capacity(cfg: AnalyzeConfig, ing: Ingested, req: pl.DataFrame, offsets: np.ndarray,
              flat: np.ndarray, ids: tuple[np.ndarray, int]) -> pa.Table:
    prompt = req["prompt_tokens"].to_numpy()
    caps = list(cfg.capacities) if cfg.capacities else None
    return capacity_curve(offsets, flat, prompt, ing.block_size, ing.hit_rule, caps, ids=ids)


def build_summary(cfg: AnalyzeConfig, ing: Ingested, req: pl.DataFrame, summaries: pl.DataFrame,
                  prefixes: pl.DataFrame, curve: pa.Table) -> dict[str, Any]:
    """The stable JSON summary (docs/analyze.md lists every key)."""
    n = req.height
    overall = rates(req)
    steady = rates(req.filter(pl.col("seq") >= n // 2))
    prompt = int(req["prompt_tokens"].sum()) if n else 0
    cached = int(req["cached_tokens"].sum()) if n else 0
    tenant_cached = int(req["tenant_cached_tokens"].sum()) if n else 0
    reasons: dict[str, int] = {}
    for r in ing.rejects:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    has_conv = int(req["conversation_id"].is_not_null().sum()) if n else 0
    gaps = (req["arrival_s"].to_numpy() - req["arrival_s"].to_numpy()[np.maximum(req["_source"].to_numpy(), 0)]
            )[req["_source"].to_numpy() >= 0] if n else np.zeros(0)
    actual = req.filter(pl.col("actual_cached_tokens").is_not_null())
    notes = []
    if n and has_conv == 0:
        notes.append("The log has no conversation id: same-conversation reuse cannot be told apart from "
                     "same-tenant reuse (none was invented). Map one with --field conversation_id=PATH.")
    if ing.approximate_template:
        notes.append(f"Chat prompts were rendered with prefixscan's ChatML-style template ({ing.template_version}),"
                     " an approximation of the engine's; pass --tokenizer hf:<model dir> for exact token counts.")
    if ing.tokenizer_stats.get("fallback_reason"):
        notes.append("Tokenisation fell back to the direct path: " + str(ing.tokenizer_stats["fallback_reason"]))
    curve_py = curve.to_pydict()
    capacity: dict[str, Any] = {}
    if curve.num_rows:
        capacity = {"points": [
            {"capacity_tokens": c, "lru_hit_rate": lr, "opt_hit_rate": o}
            for c, lr, o in zip(curve_py["capacity_tokens"], curve_py["lru_hit_rate"], curve_py["opt_hit_rate"],
                                strict=True)]}
        capacity.update(capacity_targets(curve))
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
        "by_model": by_dimension(summaries, "model"),
        "by_turn": by_dimension(summaries, "turn_index"),
        "conversations": {"share_with_id": has_conv / n if n else 0.0,
                          "distinct": int(req["conversation_id"].n_unique() - (1 if has_conv < n else 0)) if n else 0},
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
                  "isolate_tenants": cfg.isolate_tenants, "tokenizer_stats": ing.tokenizer_stats},
        "top_prefixes": [
            {k: r[k] for k in ("rank", "prefix_tokens", "hits", "tokens_saved", "tenants", "snippet")}
            for r in prefixes.head(5).iter_rows(named=True)],
        "notes": notes,
    }


def _manifest(cfg: AnalyzeConfig, ing: Ingested, tables: dict[str, pa.Table], summary: dict[str, Any]) -> dict:
    return {
        "tool": "prefixscan", "version": __version__,
        "command_line": cfg.command_line or shlex.join(sys.argv),
        "config": {**replace(cfg, extras={}).to_json(), "block_size": ing.block_size, "hit_rule": ing.hit_rule,
                   "token_block_size": cfg.block_size},
        "inputs": [s.to_json() for s in ing.sources],
        "tables": {name: {"rows": t.num_rows, "stage": "analyze"} for name, t in tables.items()},
        # The whole summary, so reports and later commands re-render without re-analysing.
        "analyze": {"timings": summary.get("timings", {}), "hit_rate": summary["hit_rate"],
                    "requests": summary["requests"], "summary": summary},
    }
