"""The fast ideal-cache analysis equals brute force; hit rules; namespaces and salts never share."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.encode.hashing import block_hashes, hit_tokens, mix_ids, namespace_hash
from prefixscan.reuse.ideal import TokenPrefixIndex, ideal_reuse, scope_salts
from tests.oracles.ideal_ref import ideal_reuse_ref, token_lcp_ref

B = 4


def chain_ids(ids: list[int], root: int) -> np.ndarray:
    """Hashed-trace ids in a namespace, the way ingest puts them there."""
    return mix_ids(np.asarray(ids, dtype=np.int64), root)


def test_vllm_rule_identical_32_token_repeat_hits_16() -> None:
    assert hit_tokens(2, 32, 16, "vllm") == 16
    assert hit_tokens(2, 33, 16, "vllm") == 32
    assert hit_tokens(0, 100, 16, "vllm") == 0
    assert hit_tokens(3, 40, 16, "trace") == 40  # partial last block at its true size


def test_hashes_chain_and_namespaces_separate() -> None:
    toks = np.arange(64, dtype=np.uint32)
    root_a = namespace_hash("m", "tok", None, "v1")
    h = block_hashes(toks, 16, root_a)
    assert len(h) == 4 and len(set(h.tolist())) == 4
    assert np.array_equal(block_hashes(toks, 16, root_a), h)  # deterministic
    # Same tokens under another model, adapter, template, salt or tenant never share a block.
    for other in (namespace_hash("m2", "tok", None, "v1"), namespace_hash("m", "tok", "lora1", "v1"),
                  namespace_hash("m", "tok", None, "v2"), namespace_hash("m", "tok", None, "v1", cache_salt="s"),
                  namespace_hash("m", "tok", None, "v1", tenant_salt="t")):
        assert not set(block_hashes(toks, 16, other).tolist()) & set(h.tolist())
    # A change in block 1 changes every later hash (chaining), not block 0.
    t2 = toks.copy()
    t2[20] = 999
    h2 = block_hashes(t2, 16, root_a)
    assert h2[0] == h[0] and not set(h2[1:].tolist()) & set(h.tolist())
    assert len(block_hashes(np.arange(15, dtype=np.uint32), 16, root_a)) == 0  # only full blocks


@st.composite
def traces(draw):
    """Random requests built from a small alphabet so prefixes are often shared."""
    n = draw(st.integers(1, 25))
    reqs = []
    for _ in range(n):
        if reqs and draw(st.booleans()):
            base = draw(st.sampled_from(reqs))[0]
            cut = draw(st.integers(0, len(base)))
            toks = base[:cut] + draw(st.lists(st.integers(0, 3), max_size=12))
        else:
            toks = draw(st.lists(st.integers(0, 3), min_size=1, max_size=20))
        if not toks:
            toks = [0]
        reqs.append((toks, draw(st.sampled_from(["a", "b", None])), draw(st.sampled_from(["c1", "c2", None]))))
    return reqs


@settings(max_examples=150, deadline=None)
@given(traces(), st.sampled_from(["vllm", "trace"]))
def test_fast_equals_bruteforce(reqs, rule) -> None:
    root = 12345
    blocks = []
    for toks, _, _ in reqs:
        arr = np.asarray(toks, dtype=np.uint32)
        if rule == "vllm":
            blocks.append(block_hashes(arr, B, root))
        else:  # hashed-trace style: the partial last block gets its own id
            ids = [hash(tuple(toks[: (j + 1) * B])) & 0xFFFFFFFF for j in range(-(-len(toks) // B))]
            blocks.append(chain_ids(ids, root))
    prompt = np.array([len(t) for t, _, _ in reqs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blocks])]).astype(np.int64)
    flat = np.concatenate(blocks) if blocks else np.zeros(0, np.uint64)
    tenants = [t for _, t, _ in reqs]
    convs = [c for _, _, c in reqs]
    fast = ideal_reuse(offsets, flat, prompt, B, rule, scope_salts(tenants), scope_salts(convs))
    ref = ideal_reuse_ref([b.tolist() for b in blocks], prompt.tolist(), B, rule, tenants, convs)
    assert fast.cached_blocks.tolist() == ref["k"]
    assert fast.cached_tokens.tolist() == ref["tokens"]
    assert fast.tenant_cached_tokens.tolist() == ref["tenant_tokens"]
    assert fast.conversation_cached_tokens.tolist() == ref["conv_tokens"]
    assert fast.source.tolist() == ref["source"]


@settings(max_examples=150, deadline=None)
@given(traces(), st.integers(1, 5))
def test_token_granularity_equals_bruteforce(reqs, bs) -> None:
    index = TokenPrefixIndex(bs)
    roots = [1 if t == "a" else 2 for _, t, _ in reqs]
    got = []
    for (toks, _, _), root in zip(reqs, roots, strict=True):
        arr = np.asarray(toks, dtype=np.uint32)
        lcp = index.add(arr, block_hashes(arr, bs, root), root)
        got.append(min(lcp, max(len(toks) - 1, 0)))
    assert got == token_lcp_ref([t for t, _, _ in reqs], roots)


def test_token_granularity_counts_partial_block() -> None:
    index = TokenPrefixIndex(16)
    a = np.arange(40, dtype=np.uint32)
    b = np.concatenate([np.arange(37), [999, 998, 997]]).astype(np.uint32)
    index.add(a, block_hashes(a, 16, 7), 7)
    assert index.add(b, block_hashes(b, 16, 7), 7) == 37  # 2 full blocks + 5 tokens of the third


@pytest.mark.parametrize("salts", [["t1", "t2"], [None, "t2"]])
def test_tenant_scope_never_shares(salts) -> None:
    h = chain_ids([1, 2, 3], 9)
    offsets = np.array([0, 3, 6], dtype=np.int64)
    res = ideal_reuse(offsets, np.concatenate([h, h]), np.array([48, 48]), 16, "trace",
                      scope_salts(salts), scope_salts([None, None]))
    assert res.cached_tokens.tolist() == [0, 48]
    assert res.tenant_cached_tokens.tolist() == [0, 0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), max_size=5), min_size=1, max_size=12),
       st.lists(st.integers(0, 3), min_size=12, max_size=12))
def test_salted_dense_ids_equal_ids_of_the_salted_hashes(rows, salt_pick) -> None:
    """dense_ids(flat, offsets, salts) numbers exactly what dense_ids(flat ^ salt per row) numbers."""
    from prefixscan.encode.dense import dense_ids

    lengths = [len(r) for r in rows]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.array([x for r in rows for x in r], dtype=np.uint64)
    salts = np.array([[0, 1, 7, 2**63][salt_pick[i]] for i in range(len(rows))], dtype=np.uint64)
    ids, n = dense_ids(flat, offsets, salts)
    ref, n_ref = dense_ids(flat ^ np.repeat(salts, lengths))
    assert n == n_ref and ids.tolist() == ref.tolist()
