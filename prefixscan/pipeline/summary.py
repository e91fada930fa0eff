"""The stable JSON summary of an analysis (docs/analyze.md lists every key) and the notes it carries."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.vllm_hash import hash_description
from prefixscan.pipeline.aggregate import SideStats
from prefixscan.pipeline.encode import Ingested
from prefixscan.read.sources import walk_notes
from prefixscan.reuse.aggregate import by_dimension, percentiles, rates, steady_state
from prefixscan.reuse.capacity.sampled import AUTO_SAMPLE_BLOCKS
from prefixscan.reuse.capacity.table import capacity_sampling, capacity_targets
from prefixscan.version import __version__


def skipped_note(inputs: tuple[str, ...]) -> list[str]:
    """What the walk over the inputs passed over: files with no known suffix, dangling symlinks, FIFOs,
    unreadable directories, and paths that reach a file already read (`sources.Walk.notes`)."""
    return walk_notes(inputs)


def check_accepted(counts: dict[str, Any], run_dir: str | None) -> None:
    """Raise NothingAcceptedError (exit 3) when no record was accepted: a run that measured nothing must
    not look like a success, from the CLI or from `prefixscan.analyze()`."""
    if counts["accepted"]:
        return
    from prefixscan.errors import NothingAcceptedError

    reasons = ", ".join(f"{k} {v}" for k, v in sorted(counts["rejects_by_reason"].items(), key=lambda kv: -kv[1]))
    where = f"; the rejects are in {run_dir}/rejects.parquet" if run_dir else "; pass -o RUN to keep the rejects"
    raise NothingAcceptedError(f"no record accepted: {counts['read']:,} read, {counts['rejected']:,} rejected"
                               f"{' (' + reasons + ')' if reasons else ''}{where}")


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
    models = by_dimension(summaries, "model")
    notes = _notes(cfg, ing, n, has_conv, len(models))
    capacity = _capacity(curve)
    sampling = capacity_sampling(curve) if curve.num_rows else None
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
                  "hash": hash_description(cfg),
                  "fields": ing.fields.summary(ing.conversations_inferred) if ing.fields is not None else {}},
        "top_prefixes": [
            {k: r[k] for k in ("rank", "prefix_tokens", "hits", "tokens_saved", "tenants", "snippet")}
            for r in prefixes.head(5).iter_rows(named=True)],
        "notes": notes,
    }


def _notes(cfg: AnalyzeConfig, ing: Ingested, n: int, has_conv: int, n_models: int) -> list[str]:
    """What the summary must say about the input, the tokenizer and the hash."""
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
    notes += ing.read_notes + (ing.fields.warnings() if ing.fields is not None else [])
    notes += input_notes(ing, n) + skipped_note(cfg.inputs)
    return notes + _tokenizer_notes(cfg, ing, n_models)


def _tokenizer_notes(cfg: AnalyzeConfig, ing: Ingested, n_models: int) -> list[str]:
    notes = []
    stats = ing.tokenizer_stats
    if stats.get("fallback_reason"):
        notes.append("Tokenisation fell back to the direct path: " + str(stats["fallback_reason"]))
    if stats.get("media_items"):
        notes.append(f"{stats['media_items']:,} media items (images, audio, files) were keyed by "
                     "content and counted as a short placeholder: the model's processor expands each to its own "
                     "number of tokens, so prompt token counts of those requests are prefixscan's, not the engine's.")
    if stats.get("vllm_lora_without_path"):
        notes.append(f"{stats['vllm_lora_without_path']} LoRA requests had no --lora-path: vLLM hashes "
                     "the adapter's name and path, so their block hashes are not the engine's (hits are unaffected).")
    if cfg.hash != "xxh3" and {"mooncake", "bailian"} & set(ing.shapes.values()):
        notes.append(f"Hashed traces keep their own block ids: --hash {cfg.hash} applies to token and text "
                     "prompts only.")
    if cfg.hash != "xxh3" and n_models > 1:
        notes.append(f"{n_models} models in one log under --hash {cfg.hash}: vLLM's hash has no model in it, so "
                     "equal token prefixes of different models count as shared; analyse one model at a time.")
    if str(stats.get("memo_rule") or "").startswith("segments ("):
        notes.append("Tokenisation memo: " + str(stats["memo_rule"]) + " (exact; less reuse).")
    return notes


def sampling_note(cfg: AnalyzeConfig, sampling: dict[str, Any]) -> str:
    """The summary's line on a sampled capacity curve: why, at which rate, and how wide its band is."""
    why = ("as asked (--capacity-sample)" if cfg.capacity_sample is not None else
           f"because the log lists more than {AUTO_SAMPLE_BLOCKS:,} blocks (--capacity-sample 1 forces the exact "
           "curve)")
    return (f"The capacity curve's LRU columns are sampled {why}: SHARDS at rate {sampling['rate']:g} with the "
            f"{sampling['hot_blocks']:,} hottest blocks exact, {sampling['salts']} salts; band (lru_hit_rate_low.."
            f"high) {sampling['band_mean_points']:.2f} points wide on average; OPT was not computed.")


def _capacity(curve: pa.Table) -> dict[str, Any]:
    """The capacity curve's points and targets, as the summary lists them."""
    if not curve.num_rows:
        return {}
    c = curve.to_pydict()
    capacity: dict[str, Any] = {"points": [
        {"capacity_tokens": k, "lru_hit_rate": lr, "opt_hit_rate": o}
        for k, lr, o in zip(c["capacity_tokens"], c["lru_hit_rate"], c["opt_hit_rate"], strict=True)]}
    capacity.update(capacity_targets(curve))
    return capacity
