"""Sampled LRU curves (SHARDS with the hottest blocks exact) against the exact one-pass curve."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.reuse.capacity import block_weights, lru_curves, prepare
from prefixscan.reuse.capacity_sampled import hot_blocks, sample_mask, sampled_lru_curve


def workload(seed: int, n: int = 400) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chained requests: a few hot system prompts, conversations that grow, unique tails."""
    rng = np.random.default_rng(seed)
    rows, next_id = [], 10_000
    systems = [list(range(s * 100, s * 100 + rng.integers(2, 8))) for s in range(5)]
    convs: list[list[int]] = []
    for _ in range(n):
        if convs and rng.random() < 0.5:
            c = convs[rng.integers(len(convs))]
            c += list(range(next_id, next_id + rng.integers(1, 4)))
            next_id += 4
            rows.append(list(c))
        else:
            c = list(systems[rng.integers(len(systems))]) + list(range(next_id, next_id + rng.integers(1, 6)))
            next_id += 6
            convs.append(c)
            rows.append(list(c))
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    hashes = np.concatenate([np.asarray(r, np.uint64) for r in rows])
    prompt = np.asarray([16 * len(r) - int(rng.integers(0, 8)) for r in rows], np.int64)
    return offsets, hashes, prompt


def exact_at(offsets, hashes, prompt, caps) -> np.ndarray:
    tok, _ = lru_curves(prepare(offsets, hashes, prompt, 16, "vllm"))
    return tok[np.minimum(caps, len(tok) - 1)]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_rate_one_is_the_exact_curve(seed: int) -> None:
    offsets, hashes, prompt = workload(seed, 120)
    caps = np.arange(0, 200, 7)
    w = block_weights(offsets, prompt, 16, "vllm")
    got = sampled_lru_curve(offsets, hashes, w, caps, 1.0, salts=1)
    assert np.array_equal(got.hit_tokens, exact_at(offsets, hashes, prompt, caps).astype(np.float64))
    assert got.sampled_references == got.total_references and got.hot == 0


def test_sampled_is_close_deterministic_and_banded() -> None:
    offsets, hashes, prompt = workload(7, 4000)
    caps = np.unique(np.geomspace(1, 8000, 20).astype(int))
    w = block_weights(offsets, prompt, 16, "vllm")
    exact = exact_at(offsets, hashes, prompt, caps)
    total = prompt.sum()
    a = sampled_lru_curve(offsets, hashes, w, caps, 0.1, hot=64, salts=3, seed=1)
    b = sampled_lru_curve(offsets, hashes, w, caps, 0.1, hot=64, salts=3, seed=1)
    assert np.array_equal(a.hit_tokens, b.hit_tokens)
    assert np.all(a.low <= a.hit_tokens) and np.all(a.hit_tokens <= a.high)
    assert np.mean(np.abs(a.hit_tokens - exact)) / total < 0.02  # within 2 points of the exact curve
    assert a.sampled_references < a.total_references


def test_sampling_is_per_block_and_hot_blocks_are_found() -> None:
    h = np.repeat(np.arange(1000, dtype=np.uint64), 3)
    m = sample_mask(h, 0.25, 0)
    assert np.array_equal(m[0::3], m[1::3]) and 0.15 < m.mean() < 0.35  # every reference of a kept block
    skew = np.concatenate([np.full(5000, 7, np.uint64), np.arange(100, 5100, dtype=np.uint64)])
    assert 7 in hot_blocks(skew, 0.01, 4, 0)
    with pytest.raises(ValueError, match="sampling rate"):
        sampled_lru_curve(np.array([0, 1]), np.array([1], np.uint64), np.array([16]), np.array([1]), 0.0)
