"""The top-prefixes table: ranking on the cheap sum first must not change any row of the top k."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.privacy import DEFAULT_SNIPPET_K
from prefixscan.redact import redact_snippet
from prefixscan.reuse.prefixes import (
    ROW_COLUMNS,
    TOP,
    aggregate_prefixes,
    common_prefix,
    member,
    shared_text,
    top_prefix_hashes,
)


def prefixes_table(req: pl.DataFrame, deepest: np.ndarray, snippets: list[str], top: int = TOP,
                   include_text: bool = False, k: int = DEFAULT_SNIPPET_K) -> pl.DataFrame:
    """The prefixes table of a log in memory, from its requests' deepest matched block hash (the run
    builds it part by part through `aggregate_prefixes`, as this does at once).

    One row per shared prefix (the deepest matched block hash) among requests that hit.

    `tokens_saved` is the prefill the ideal cache avoids through that prefix; `tenants` counts distinct
    tenants that hit it, and `cross_tenant_hits` the hits that only another tenant's request could serve.
    A snippet shows the text every hit of the prefix starts with, only when hits from at least `k`
    independent sources share it (`prefixscan.privacy.may_show`), redacted and truncated; otherwise a
    `hidden()` marker.
    `--include-text` shows the first hit's source text instead. An empty `snippets` list means the log has
    no text (hashed traces). `req` rows are in analysis order (seq = row).
    """
    hit = req["cached_blocks"].to_numpy() > 0
    keep = top_prefix_hashes(deepest[hit], req["cached_tokens"].to_numpy()[hit], top)
    rows = np.nonzero(hit & member(deepest, keep))[0]
    df = req[rows].select(*ROW_COLUMNS).with_columns(pl.Series("prefix_hash", deepest[rows], dtype=pl.UInt64))
    src = req["_source"].to_numpy()

    def first_ids(seqs: np.ndarray) -> list[str]:
        return req["request_id"].gather(seqs).to_list()

    def first_snippets(seqs: np.ndarray) -> list[str]:
        return [snippets[s] if s >= 0 and snippets else "" for s in src[seqs].tolist()]

    def own_snippets(seqs: np.ndarray) -> list[str]:
        return [snippets[s] for s in seqs.tolist()] if snippets else [""] * len(seqs)

    return aggregate_prefixes(df, first_ids, first_snippets, top, include_text, own_snippets, k)


def _requests(rows: list[tuple[int, int, int]]) -> tuple[pl.DataFrame, np.ndarray]:
    """(deepest prefix id, cached tokens, tenant) per request, in arrival order."""
    n = len(rows)
    req = pl.DataFrame({
        "seq": np.arange(n, dtype=np.int64),
        "tenant": [f"t{t}" for _, _, t in rows],
        "conversation_id": [f"c{i}" for i in range(n)],
        "user": pl.Series([None] * n, dtype=pl.String),
        "arrival_s": np.arange(n, dtype=np.float64) * 1.5,
        "cached_tokens": np.array([c for _, c, _ in rows], dtype=np.int64),
        "prompt_tokens": np.array([c + 40 for _, c, _ in rows], dtype=np.int64),
        "tenant_cached_tokens": np.array([c if t == 0 else 0 for _, c, t in rows], dtype=np.int64),
        "cached_blocks": np.array([1 if c else 0 for _, c, _ in rows], dtype=np.int32),
        "request_id": [f"r{i}" for i in range(n)],
        "_source": np.where(np.array([c for _, c, _ in rows]) > 0, 0, -1).astype(np.int64),
    })
    deepest = np.array([p for p, _, _ in rows], dtype=np.uint64)
    return req, deepest


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.sampled_from([0, 16, 32, 48]), st.integers(0, 2)),
                min_size=1, max_size=80), st.integers(1, 6))
def test_top_k_rows_equal_the_head_of_the_whole_table(rows, k) -> None:
    req, deepest = _requests(rows)
    snippets = [f"text {i}" for i in range(len(rows))]
    whole = prefixes_table(req, deepest, snippets, top=10_000)
    top = prefixes_table(req, deepest, snippets, top=k)
    assert top.equals(whole.head(k))
    assert whole["tokens_saved"].to_list() == sorted(whole["tokens_saved"].to_list(), reverse=True)


def test_hits_and_gaps_of_one_prefix() -> None:
    req, deepest = _requests([(7, 32, 0), (7, 32, 1), (9, 0, 0), (7, 16, 0)])
    t = prefixes_table(req, deepest, [], top=5).to_dicts()
    assert len(t) == 1
    row = t[0]
    assert (row["hits"], row["tokens_saved"], row["tenants"], row["cross_tenant_hits"]) == (3, 80, 2, 1)
    assert row["median_reuse_gap_s"] == 2.25 and row["snippet"] == ""


def _shared_log(texts: list[str], convs: list[str | None], tenants: list[str | None] | None = None,
                users: list[str | None] | None = None):
    """Every request hits the same prefix (id 7); request i has snippet texts[i] and conversation convs[i]."""
    n = len(texts)
    req, deepest = _requests([(7, 32, 0)] * n)
    req = req.with_columns(pl.Series("conversation_id", convs, dtype=pl.String),
                           pl.Series("tenant", tenants or [None] * n, dtype=pl.String),
                           pl.Series("user", users or [None] * n, dtype=pl.String))
    return req, deepest


SYSTEM = "You are the support assistant of Initech. Answer politely."


def test_text_shared_by_k_conversations_is_shown_and_stops_where_they_differ() -> None:
    texts = [f"{SYSTEM} | My name is {name}" for name in ("Zorblax", "Quenby", "Ildred", "Vashti", "Oriel")]
    req, deepest = _shared_log(texts, [f"c{i}" for i in range(5)])
    (row,) = prefixes_table(req, deepest, texts, k=5).to_dicts()
    assert row["snippet"] == f"{SYSTEM} | My name is"
    for name in ("Zorblax", "Quenby", "Ildred", "Vashti", "Oriel"):
        assert name not in row["snippet"]


def test_one_customers_text_is_hidden_however_often_it_repeats() -> None:
    texts = [f"{SYSTEM} | I am Zorblax Quenby, account 4411"] * 40
    req, deepest = _shared_log(texts, ["conv-z"] * 40)  # 40 turns of one conversation
    (row,) = prefixes_table(req, deepest, texts, k=5).to_dicts()
    assert row["snippet"] == f"<text {row['prefix_hash']:016x}"[:12] + f"… {row['prefix_tokens']} tokens>"
    assert "Zorblax" not in row["snippet"] and "Initech" not in row["snippet"]
    # forty conversations repeating the same request with the same surroundings are one source
    req40, deepest40 = _shared_log(texts, [f"c{i}" for i in range(40)])
    assert prefixes_table(req40, deepest40, texts, k=2)["snippet"][0].startswith("<text ")
    # four users are still fewer than k = 5; k = 4 lets the shared text through, redacted
    req4, deepest4 = _shared_log(texts, [f"c{i}" for i in range(40)], users=[f"u{i % 4}" for i in range(40)])
    assert prefixes_table(req4, deepest4, texts, k=5)["snippet"][0].startswith("<text ")
    assert prefixes_table(req4, deepest4, texts, k=4)["snippet"][0] == redact_snippet(texts[0])
    assert prefixes_table(req4, deepest4, texts, k=5, include_text=True)["snippet"][0] == texts[0][:96]


def test_sharers_fall_back_to_tenants_and_requests_without_ids_count_for_nobody() -> None:
    texts = [SYSTEM] * 10
    req, deepest = _shared_log(texts, [None] * 10, [f"tenant{i % 5}" for i in range(10)])
    assert prefixes_table(req, deepest, texts, k=5)["snippet"][0] == SYSTEM
    req, deepest = _shared_log(texts, [None] * 10)  # no conversation, user or tenant: nobody vouches
    assert prefixes_table(req, deepest, texts, k=5)["snippet"][0].startswith("<text ")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.text("ab| é", max_size=12)), min_size=1, max_size=60),
       st.integers(1, 7))
def test_shared_text_is_the_common_prefix_of_every_hit(rows, chunk) -> None:
    n = len(rows)
    df = pl.DataFrame({"seq": np.arange(n, dtype=np.int64),
                       "prefix_hash": np.array([h for h, _ in rows], dtype=np.uint64)})
    texts = [t for _, t in rows]
    got = shared_text(df, lambda seqs: [texts[i] for i in seqs.tolist()], chunk=chunk)
    if not any(texts):
        assert got == {}
        return
    for h in {h for h, _ in rows}:
        members = [t for g, t in rows if g == h]
        want = members[0]
        for t in members[1:]:
            want = common_prefix(want, t)
        assert got[h] == want and all(t.startswith(got[h]) for t in members)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 50)), max_size=60), st.integers(1, 6))
def test_top_prefix_hashes_equals_a_dict_ranking(rows: list, top: int) -> None:
    """The sort-based ranking is the plain one: tokens saved per prefix, most first, ties by smaller hash."""
    from prefixscan.reuse.prefixes import top_prefix_hashes

    sums: dict[int, int] = {}
    for h, t in rows:
        sums[h] = sums.get(h, 0) + t
    want = sorted(sums, key=lambda h: (-sums[h], h))[:top]
    got = top_prefix_hashes(np.array([h for h, _ in rows], np.uint64), np.array([t for _, t in rows], np.int64), top)
    assert got.tolist() == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.sampled_from([0, 16, 32, 48]), st.integers(0, 2)),
                min_size=1, max_size=80), st.integers(1, 9), st.integers(1, 20))
def test_prefixes_grouped_in_parts_equal_one_group_by(rows, part_rows, k) -> None:
    """Many hit rows are grouped in parts by prefix hash (bounded memory): the same table, any part size,
    with one prefix's rows far beyond a part."""
    import prefixscan.reuse.prefixes as prefixes

    req, deepest = _requests(rows + [(5, 32, 1)] * 12)
    snippets = [f"text {i}" for i in range(req.height)]
    whole = prefixes_table(req, deepest, snippets, top=k)
    saved = prefixes.PART_ROWS
    prefixes.PART_ROWS = part_rows
    try:
        parted = prefixes_table(req, deepest, snippets, top=k)
    finally:
        prefixes.PART_ROWS = saved
    assert parted.equals(whole)
