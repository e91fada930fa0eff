"""Counterfactual re-analysis: the ideal-cache hit with the breakers removed, and who gets the credit.

Only affected requests are rewritten (their new block hashes come from the detector); every other
request keeps its hashes, and `ideal_reuse` runs once more over the whole log. A request's gain is split
among the findings whose operations rewrote it (gain = prefill tokens saved, i.e. the drop in
uncached tokens, since a rewrite may change the prompt's length); a request that gained without being rewritten (its
source was) credits the findings of that source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from prefixscan.reuse.ideal import ideal_reuse


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


def run_counterfactual(req: pl.DataFrame, offsets: np.ndarray, flat: np.ndarray, block_size: int, rule: str,
                       rewritten: dict[str, tuple[np.ndarray | list[np.ndarray], int]], keys: dict[str, list[object]],
                       baseline: np.ndarray | None = None) -> Counterfactual:
    """Re-run the ideal analysis with `rewritten` hashes (request id -> (hashes, or their consecutive parts,
    prompt tokens))."""
    n = req.height
    cf = Counterfactual()
    if n == 0:
        return cf
    ids = req["request_id"].to_list()
    prompt = req["prompt_tokens"].to_numpy().astype(np.int64)
    new_prompt = prompt.copy()
    parts: list[np.ndarray] = []
    lengths = np.diff(np.asarray(offsets[:n + 1], dtype=np.int64))
    for i, rid in enumerate(ids):
        rw = rewritten.get(rid)
        if rw is not None:
            segs = rw[0] if isinstance(rw[0], list | tuple) else [rw[0]]
            parts.extend(segs)
            lengths[i] = sum(len(s) for s in segs)
            new_prompt[i] = rw[1]
            cf.requests_rewritten += 1
        else:
            parts.append(flat[offsets[i]:offsets[i + 1]])
    new_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_off[1:])
    new_flat = np.concatenate(parts) if n else np.zeros(0, np.uint64)
    if baseline is None:
        baseline = req["cached_tokens"].to_numpy().astype(np.int64)
    # Only the whole-log scope is read below (hits and their source request): zero salts skip the tenant
    # and conversation passes, two thirds of the work.
    no_scope = np.zeros(n, dtype=np.uint64)
    res = ideal_reuse(new_off, np.asarray(new_flat, dtype=np.uint64), new_prompt, block_size, rule, no_scope, no_scope)
    after = res.cached_tokens.astype(np.int64)
    cf.prompt_before, cf.prompt_after = int(prompt.sum()), int(new_prompt.sum())
    cf.cached_before, cf.cached_after = int(baseline.sum()), int(after.sum())
    # Prefill saved: the drop in uncached tokens (a replaced template version may change the prompt length).
    gain = (prompt - baseline) - (new_prompt - after)
    for i in np.nonzero(gain)[0].tolist():
        rid = ids[i]
        owners = keys.get(rid)
        if not owners and res.source[i] >= 0:
            owners = keys.get(ids[int(res.source[i])])
        if not owners:
            continue
        share, rest = divmod(int(gain[i]), len(owners))
        for j, k in enumerate(owners):
            cf.credit.setdefault(k, {})[rid] = share + (rest if j == 0 else 0)
    return cf
