"""The chain cache's compiled pass (`_core.c` chain_keys) equals its pure-Python reference (`ChainCache._keys`).

Random multi-turn conversations (turns that continue, edit an earlier piece, truncate, or start afresh,
several conversations interleaved) go through two chain caches, one per path, at normal and tiny byte
budgets (evictions on every request), with prefixscan's hash and vLLM's. Hashes, the reuse counters and
the cache's keys in LRU order must be the same, and the hashes equal hashing each prompt whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscan.encode import core as encode_core
from prefixscan.encode.hashing import ChainCache, block_hashes
from prefixscan.encode.vllm_hash import RequestKeys, VllmHasher
from tests.conftest import compiled

pytestmark = pytest.mark.skipif(encode_core._compiled is None,
                                reason="compiled core not built (pip install -e . builds it)")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)

STEP = st.tuples(st.sampled_from(["continue", "continue", "continue", "edit", "truncate", "new"]),
                 st.integers(0, 3), st.integers(0, 9), st.lists(st.integers(0, 40), min_size=1, max_size=4))


def _prompts(steps: list[Any], seed: int, key_len: int) -> Iterator[tuple[np.ndarray, int, list, list, list]]:
    """Requests of up to four interleaved conversations: (tokens, root, piece keys, piece lens, checkpoints)."""
    rng = np.random.default_rng(seed)
    convs: dict[int, list[np.ndarray]] = {}
    for what, conv, at, sizes in steps:
        pieces = convs.get(conv, [])
        if what == "new" or not pieces:
            pieces = []
        elif what == "edit":
            pieces = list(pieces)
            pieces[at % len(pieces)] = rng.integers(0, 50, len(pieces[at % len(pieces)]) + 1).astype(np.uint32)
        elif what == "truncate":
            pieces = pieces[: at % len(pieces)]
        pieces = [*pieces, *(rng.integers(0, 50, n).astype(np.uint32) for n in sizes)]
        convs[conv] = pieces
        # a piece's key names its content (as the tokenizers' memo keys do); 16 bytes, or other lengths
        keys = [(p.tobytes() + b"k").ljust(key_len, b"\0")[:key_len] if key_len else p.tobytes() + b"|"
                for p in pieces]
        toks = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint32)
        cps = sorted({0, len(pieces) - 2, at % (len(pieces) + 2) - 1})
        yield toks, 7 + conv % 2, keys, [len(p) for p in pieces], cps


def _run(steps: list[Any], seed: int, key_len: int, block_size: int, tiny: bool, vllm: bool, on: bool) -> Any:
    chains = ChainCache(max_bytes=1 if tiny else None, hasher=VllmHasher("sha256", "0") if vllm else None)
    keys = RequestKeys(None, "salt") if vllm else None
    out = []
    with compiled(on):
        for toks, root, pk, lens, cps in _prompts(steps, seed, key_len):
            got = chains.hashes(toks, block_size, root, pk, lens, cps, keys)
            out.append(got.tolist())
            if vllm:
                want = VllmHasher("sha256", "0").hashes(toks, block_size, None, 0, keys)
            else:
                want = block_hashes(toks, block_size, root)
            assert got.tolist() == want.tolist()
    return out, chains.blocks_hashed, chains.blocks_reused, list(chains._d._d), chains._d.bytes, chains._d.evicted


@SETTINGS
@given(st.lists(STEP, min_size=1, max_size=14), st.integers(0, 2**16), st.sampled_from([16, 16, 15, 17, 0]),
       st.sampled_from([1, 4, 16]), st.booleans(), st.booleans())
def test_chain_keys_compiled_equals_reference(steps, seed, key_len, block_size, tiny, vllm) -> None:
    pure = _run(steps, seed, key_len, block_size, tiny, vllm, on=False)
    fast = _run(steps, seed, key_len, block_size, tiny, vllm, on=True)
    assert pure == fast


def test_chain_keys_resumes_a_conversation() -> None:
    """The compiled pass finds the previous turn's checkpoint (after its next-to-last piece, and its first):
    only the blocks after it are hashed."""
    steps = [("continue", 0, 0, [32, 16]), ("continue", 0, 0, [16, 16]), ("continue", 0, 0, [16])]
    with compiled(True):
        hashes, hashed, reused, *_ = _run(steps, 1, 16, 16, tiny=False, vllm=False, on=True)
    assert [len(h) for h in hashes] == [3, 5, 6]
    assert (hashed, reused) == (3 + 3 + 2, 0 + 2 + 4)


def test_chain_keys_rejects_bad_input() -> None:
    fast = encode_core._compiled
    assert fast is not None
    od: dict = {}
    with pytest.raises(ValueError):
        fast.chain_keys([b"k" * 16], [3], 1, [0], od, 0, hash)  # block size 0
    with pytest.raises(TypeError):
        fast.chain_keys([b"k" * 16], [3], 1, [0], od, 16)  # an argument short
    with pytest.raises(TypeError):
        fast.chain_keys([b"k" * 16], ["3"], 1, [0], od, 16, hash)  # a length that is not an int
    assert fast.chain_keys([b"k" * 15], [3], 1, [0], od, 16, hash) is None  # not 16-byte keys: the reference
    assert fast.chain_keys((b"k" * 16,), [3], 1, [0], od, 16, hash) is None  # not lists: the reference
