"""Top shared prefixes: hits grouped by the deepest block they matched, ranked by prefill saved."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from prefixscan.affixes import common_prefix_length
from prefixscan.privacy import DEFAULT_SNIPPET_K, independent_sources, may_show
from prefixscan.redact import hidden, redact_snippet

TOP = 1000
SNIPPET_CHARS = 96


SCHEMA = {  # the table's columns, in order
    "rank": pl.Int64, "prefix_hash": pl.UInt64, "prefix_tokens": pl.Int64, "hits": pl.UInt32,
    "tokens_saved": pl.Int64, "tenants": pl.UInt32, "cross_tenant_hits": pl.UInt32,
    "first_hit_s": pl.Float64, "last_hit_s": pl.Float64, "median_reuse_gap_s": pl.Float64,
    "first_hit_request_id": pl.String, "snippet": pl.String}
ROW_COLUMNS = ("seq", "tenant", "conversation_id", "user", "arrival_s", "cached_tokens", "tenant_cached_tokens",
               "prompt_tokens")


def top_prefix_hashes(prefix_hash: np.ndarray, cached_tokens: np.ndarray, top: int = TOP) -> np.ndarray:
    """The `top` prefixes by tokens saved (ties: smaller hash first), over the requests that hit (one
    prefix hash and hit each).

    Ranking first on the cheap sum, then aggregating only the rows of the top prefixes: the per-group
    median of reuse gaps over every distinct prefix cost more than the rest of the table. A sort, not a
    hash group-by: millions of distinct prefixes then cost a few arrays of 8 bytes per hit."""
    if len(prefix_hash) == 0:
        return np.zeros(0, np.uint64)
    # Stable (timsort) rather than introsort: the hit rows of a trace repeat few prefixes, in runs, which
    # timsort merges cheaply. The order within a prefix does not matter: a sum does not depend on it.
    order = np.argsort(prefix_hash, kind="stable")
    keys = prefix_hash[order]
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    sums = np.add.reduceat(np.asarray(cached_tokens, dtype=np.int64)[order], starts)
    uniq = keys[starts]
    return uniq[np.lexsort((uniq, -sums))[:top]]


def member(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """values in keys (a few thousand keys): binary search, with no sort of `values` (np.isin's way)."""
    if len(keys) == 0:
        return np.zeros(len(values), dtype=np.bool_)
    keys = np.sort(keys)
    return keys[np.minimum(np.searchsorted(keys, values), len(keys) - 1)] == values


def aggregate_prefixes(df: pl.DataFrame, first_ids: Callable[[np.ndarray], list[str]],
                       first_snippets: Callable[[np.ndarray], list[str]], top: int = TOP,
                       include_text: bool = False, own_snippets: Callable[[np.ndarray], list[str]] | None = None,
                       k: int = DEFAULT_SNIPPET_K) -> pl.DataFrame:
    """The table from the hit rows of the top prefixes (ROW_COLUMNS plus `prefix_hash`, any order).
    The first hit's request id and the snippet of its source come from the callbacks, given those
    requests' seq: only a thousand rows need them. `own_snippets` gives each hit's own snippet (for the
    text all hits share); without it no text is shown unless `include_text`."""
    if df.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    g = _ranked(df if df["seq"].is_sorted() else df.sort("seq"), top)
    first = g["_first"].to_numpy()
    if include_text:
        shown = [(s or "")[:SNIPPET_CHARS] for s in first_snippets(first)]
    else:
        shared = shared_text(df, own_snippets) if own_snippets is not None else {}
        sources = shared_sources(df, shared, own_snippets) if own_snippets is not None and shared else {}
        shown = [_shown(shared.get(h), sources.get(h, 0), t, h, k) for h, t in
                 zip(g["prefix_hash"].to_list(), g["prefix_tokens"].to_list(), strict=True)]
    g = g.with_columns(pl.Series("first_hit_request_id", first_ids(first), dtype=pl.String),
                       pl.Series("snippet", shown, dtype=pl.String))
    return g.select(*SCHEMA)


PART_ROWS = 1 << 20  # hit rows grouped at once: the group-by's working memory is a few times its rows'


def _ranked(df: pl.DataFrame, top: int) -> pl.DataFrame:
    """The `top` prefixes' aggregates, ranked. Over more than PART_ROWS rows the prefixes are grouped in
    parts (by prefix hash modulo the number of parts; a filter keeps the rows' order): every prefix's
    rows fall in one part, so its aggregates are those of one group-by over all rows, and the top of the
    union of each part's top is the top."""
    parts = -(-df.height // PART_ROWS)
    if parts > 1:
        g = pl.concat([_top(_grouped(df.filter(pl.col("prefix_hash") % parts == j)), top) for j in range(parts)])
    else:
        g = _grouped(df)
    return _top(g, top).with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("rank"))


def _top(g: pl.DataFrame, top: int) -> pl.DataFrame:
    return g.sort(["tokens_saved", "prefix_hash"], descending=[True, False]).head(top)


def _grouped(df: pl.DataFrame) -> pl.DataFrame:
    """One row per prefix hash: its aggregates over its hit rows (in seq order)."""
    return (
        df.group_by("prefix_hash")
        .agg(
            pl.col("cached_tokens").max().alias("prefix_tokens"),
            pl.len().alias("hits"),
            pl.col("cached_tokens").sum().alias("tokens_saved"),
            pl.col("tenant").n_unique().alias("tenants"),
            (pl.col("cached_tokens") > pl.col("tenant_cached_tokens")).sum().alias("cross_tenant_hits"),
            pl.col("arrival_s").min().alias("first_hit_s"),
            pl.col("arrival_s").max().alias("last_hit_s"),
            pl.col("arrival_s").diff().median().alias("median_reuse_gap_s"),
            pl.col("seq").first().alias("_first"),
        )
    )


def _shown(text: str | None, sources: int, tokens: int, prefix_hash: int, k: int) -> str:
    """The snippet of one prefix: the shared text, redacted, when `k` independent sources share it; no
    text at all (hashed traces) stays empty; anything else is hidden behind the prefix hash and its length."""
    if text is None:
        return ""
    s = redact_snippet(text, SNIPPET_CHARS).removesuffix(" |") if may_show(sources, k) else ""  # " | ": break
    return s or hidden(tokens, "tokens", f"{prefix_hash:016x}")


SHARED_CHUNK = 1 << 18  # hit rows whose snippets are held at once


def shared_text(df: pl.DataFrame, own_snippets: Callable[[np.ndarray], list[str]],
                chunk: int = SHARED_CHUNK) -> dict[int, str | None]:
    """Per prefix hash, the longest text that every hit's snippet starts with (None: the log has no text).

    The common prefix of a set of strings is that of its smallest and largest (code point order), so
    only a running min and max per prefix are kept, a chunk of hit rows at a time."""
    lo: dict[int, str] = {}
    hi: dict[int, str] = {}
    any_text = False
    for start in range(0, df.height, chunk):
        part = df.slice(start, chunk)
        texts = own_snippets(part["seq"].to_numpy())
        any_text = any_text or any(texts)
        g = (pl.DataFrame({"h": part["prefix_hash"], "t": pl.Series(texts, dtype=pl.String)})
             .group_by("h").agg(pl.col("t").min().alias("lo"), pl.col("t").max().alias("hi")))
        for h, a, b in g.iter_rows():
            lo[h] = a if h not in lo else min(lo[h], a)
            hi[h] = b if h not in hi else max(hi[h], b)
    return {h: common_prefix(lo[h], hi[h]) for h in lo} if any_text else {}


CONTEXT_CHARS = 32  # of what follows the shared text in a hit (masked), to tell its surroundings apart
_VOLATILE = r"\w*\d\w*"  # a word with a digit (a clock, an id, a counter): the same surroundings whatever its value


def shared_sources(df: pl.DataFrame, shared: dict[int, str | None],
                   own_snippets: Callable[[np.ndarray], list[str]], chunk: int = SHARED_CHUNK) -> dict[int, int]:
    """Per prefix hash with shared text, the independent sources of its hits (`privacy.independent_sources`).
    A hit's surroundings are what follows the shared text in its snippet, words with digits masked (a
    clock or an id that changes every request does not make it another source), and its prompt's length
    (within `privacy.LENGTH_SLACK`): six copies of one customer's request are one source, a system prompt
    before different questions many. Snippets are cut (80 characters a message), so a value that grows
    moves the cut: the masked tails of a prefix are compared over the length of its shortest one."""
    parts = []
    for start in range(0, df.height, chunk):
        part = df.slice(start, chunk)
        texts = own_snippets(part["seq"].to_numpy())
        heads = [shared.get(h) for h in part["prefix_hash"].to_list()]
        tails = [t[len(h):] if h and t else None for h, t in zip(heads, texts, strict=True)]
        tail = pl.Series(tails, dtype=pl.String).str.replace_all(_VOLATILE, "#").str.slice(0, CONTEXT_CHARS)
        parts.append(part.select("prefix_hash", "user", "tenant", "conversation_id",
                                 pl.col("prompt_tokens").alias("length")).with_columns(tail.alias("context")))
    if not parts:
        return {}
    rows = pl.concat(parts).with_columns(  # no shared text (null): vouches for nobody
        pl.col("context").str.slice(0, pl.col("context").str.len_chars().min().over("prefix_hash")))
    return independent_sources(rows, "prefix_hash")


def common_prefix(a: str, b: str) -> str:
    return a[:common_prefix_length(a, b)]

