"""Counterfactual re-analysis: the ideal-cache hit with the breakers removed, and who gets the credit.

Only affected requests are rewritten (their new block hashes come from the detector); every other
request keeps its hashes, and `ideal_reuse` runs once more over the whole log. A request's gain is split
among the findings whose operations rewrote it (gain = prefill tokens saved, i.e. the drop in
uncached tokens, since a rewrite may change the prompt's length); a request that gained without being rewritten (its
source was) credits the findings of that source.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from prefixscan.reuse.ideal import IdealStream


@dataclass
class Counterfactual:
    """Hit rates as logged and after the fixes, and the per-request gains behind them."""

    prompt_before: int = 0
    prompt_after: int = 0
    cached_before: int = 0
    cached_after: int = 0
    requests_rewritten: int = 0
    detector_errors: int = 0  # records the detector skipped because it failed on them (should stay 0)
    credit: dict[object, dict[str, int]] = field(default_factory=dict)  # key -> request id -> tokens gained

    def to_json(self) -> dict[str, float | int]:
        before = round(self.cached_before / self.prompt_before, 6) if self.prompt_before else 0.0
        after = round(self.cached_after / self.prompt_after, 6) if self.prompt_after else before
        return {
            "token_weighted_as_logged": before,
            "token_weighted_after_fixes": after,
            "tokens_gained": self.cached_after - self.cached_before,
            "requests_rewritten": self.requests_rewritten,
            **({"detector_errors": self.detector_errors} if self.detector_errors else {}),
        }


Blocks = Iterable[tuple[np.ndarray, np.ndarray]]  # consecutive (local CSR offsets, hashes) chunks, in row order


def run_counterfactual(req: pl.DataFrame, blocks: Blocks, block_size: int, rule: str,
                       rewritten: Mapping[str, tuple[np.ndarray | list[np.ndarray], int]],
                       keys: Mapping[str, Sequence[object]],
                       baseline: np.ndarray | None = None, skip_unchanged: bool = True) -> Counterfactual:
    """Re-run the ideal analysis with `rewritten` hashes (request id -> (hashes, or their consecutive parts,
    prompt tokens)). `blocks` gives every request's hashes chunk by chunk (one chunk: the whole log in
    memory; a streamed run reads them back row group by row group), so only one chunk is held at a time.
    With nothing rewritten the re-run would give back the baseline (the same blocks in the same order,
    the whole-log scope the baseline was read from), so it is skipped unless `skip_unchanged` is False
    (tests compare both)."""
    n = req.height
    cf = Counterfactual()
    if n == 0:
        return cf
    prompt = req["prompt_tokens"].to_numpy().astype(np.int64)
    if baseline is None:
        baseline = req["cached_tokens"].to_numpy().astype(np.int64)
    cf.prompt_before, cf.cached_before = int(prompt.sum()), int(np.asarray(baseline, dtype=np.int64).sum())
    if not rewritten and skip_unchanged:  # after = before, nobody gained
        cf.prompt_after, cf.cached_after = cf.prompt_before, cf.cached_before
        return cf
    ids = req["request_id"].to_list()
    new_prompt = prompt.copy()
    after = np.zeros(n, dtype=np.int64)
    source = np.full(n, -1, dtype=np.int64)
    # Only the whole-log scope is read below (hits and their source request): zero salts skip the tenant
    # and conversation scopes, two thirds of the work.
    stream = IdealStream()
    at = 0
    for offsets, flat in blocks:
        m = len(offsets) - 1
        parts: list[np.ndarray] = []
        lengths = np.diff(np.asarray(offsets, dtype=np.int64))
        for i in range(m):
            rw = rewritten.get(ids[at + i])
            if rw is not None:
                segs = rw[0] if isinstance(rw[0], list | tuple) else [rw[0]]
                parts.extend(segs)
                lengths[i] = sum(len(s) for s in segs)
                new_prompt[at + i] = rw[1]
                cf.requests_rewritten += 1
            else:
                parts.append(flat[offsets[i]:offsets[i + 1]])
        new_off = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_off[1:])
        new_flat = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
        no_scope = np.zeros(m, dtype=np.uint64)
        res, _ = stream.add(new_off, new_flat, new_prompt[at:at + m], block_size, rule, no_scope, no_scope)
        after[at:at + m] = res.cached_tokens
        source[at:at + m] = res.source
        at += m
    if at != n:
        raise ValueError(f"the block chunks cover {at} requests, the table has {n}")
    stream.release()
    cf.prompt_after, cf.cached_after = int(new_prompt.sum()), int(after.sum())
    # Prefill saved: the drop in uncached tokens (a replaced template version may change the prompt length).
    gain = (prompt - baseline) - (new_prompt - after)
    for i in np.nonzero(gain)[0].tolist():
        rid = ids[i]
        owners = keys.get(rid)
        if not owners and source[i] >= 0:
            owners = keys.get(ids[int(source[i])])
        if not owners:
            continue
        share, rest = divmod(int(gain[i]), len(owners))
        for j, k in enumerate(owners):
            cf.credit.setdefault(k, {})[rid] = share + (rest if j == 0 else 0)
    return cf

