"""Predicted vs actual: when the engine's reported cached tokens regularly fall short of the prediction.

prefixscan predicts what an ideal cache would hit from the log's text. When the engine's own
`cached_tokens` are regularly lower, the cause is rarely the GPU: the engine sees a different prompt
(a hidden dynamic field, a different tokenizer or chat template, another normaliser). Reported per
tenant with the requests involved and where the engine's matches stop.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from prefixscan.detect.findings import Finding, fix_sentence

MIN_REQUESTS = 5
MIN_SHARE = 0.2


def actual_findings(req: pl.DataFrame, block_size: int) -> list[Finding]:
    """One finding per tenant where at least MIN_SHARE of the requests with an actual value fall short
    of the prediction by at least one block."""
    if req.height == 0 or "actual_cached_tokens" not in req.columns:
        return []
    a = req.filter(pl.col("actual_cached_tokens").is_not_null())
    if a.height == 0:
        return []
    a = a.with_columns(pl.col("tenant").fill_null("(none)").alias("_t"))
    out = []
    for tenant in sorted(a["_t"].unique().to_list()):
        g = a.filter(pl.col("_t") == tenant)
        short = g.filter(pl.col("predicted_minus_actual") >= block_size)
        if short.height < MIN_REQUESTS or short.height < MIN_SHARE * g.height:
            continue
        lost = short["predicted_minus_actual"].to_numpy()
        stop = int(np.median(short["actual_cached_tokens"].to_numpy()))
        worst = short.sort(["predicted_minus_actual", "seq"], descending=[True, False]).row(0, named=True)
        out.append(Finding(
            kind="actual_below_predicted", tenant=None if tenant == "(none)" else tenant, family=None, label=None,
            message_index=None, role=None, char_offset=None, token_offset=stop, block_index=stop // block_size,
            requests_affected=short.height, distinct_values=None, tokens_lost=int(lost.sum()),
            example=f"request {worst['request_id']}: predicted {worst['cached_tokens']} cached tokens, engine "
                    f"reported {worst['actual_cached_tokens']}",
            example_request_id=worst["request_id"],
            detail=f"{short.height} of {g.height} requests with an engine value fell short; the engine's matches "
                   f"stop around token {stop} (median)",
            fix=fix_sentence("actual_below_predicted", None, None),
            request_ids=short["request_id"].to_list(), request_gains=[int(x) for x in lost],
        ))
    return out
