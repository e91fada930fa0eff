"""The hit rule compiled: `hashing.hit_cap_tokens` under numba, and its array forms.

The rule is written once, in `hashing.hit_cap_tokens` (plain integer arithmetic, kept free of numba so
that hashing stays cheap to import); the kernels here compile that very function, and every path that
needs a request's hit cap (the ideal cache, the capacity curve's pools and block weights, the simulator's
workload) calls one of them. Once a request's cap is known, the tokens its first k cached blocks cover are
`block_tokens` (the simulator's engines, tiers and policies all call it). `tests/test_hitrule.py` checks
that every form agrees on the edge cases.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixscan.encode.hashing import hit_cap_tokens, is_trace_rule

cap_tokens = njit(cache=True, nogil=True)(hit_cap_tokens)


@njit(cache=True, nogil=True)
def cap_blocks(prompt_tokens, block_size, trace):  # pragma: no cover - compiled
    """Most leading listed blocks a hit may use: ceil(cap tokens / B) (vLLM: floor((n-1)/B))."""
    return -(-cap_tokens(prompt_tokens, block_size, trace) // block_size)


@njit(cache=True, nogil=True)
def block_tokens(k_blocks, block_size, cap):  # pragma: no cover - compiled
    """Cached tokens of a request's first k cached blocks, given its hit cap (`cap_tokens`): min(k * B, cap).

    Whole blocks count in full until the cap, which cuts the last one (vLLM computes the prompt's last
    token again). Scalars or arrays alike, from Python (a Python int back) or from compiled code.
    """
    return np.minimum(k_blocks * block_size, cap)


@njit(cache=True, nogil=True)
def _cap_array(prompts, block_size, trace, blocks):  # pragma: no cover - compiled
    out = np.empty(len(prompts), np.int64)
    for i in range(len(prompts)):
        out[i] = cap_blocks(prompts[i], block_size, trace) if blocks else cap_tokens(prompts[i], block_size, trace)
    return out


def cap_tokens_array(prompt_tokens: np.ndarray, block_size: int, rule: str) -> np.ndarray:
    """`hashing.hit_cap_tokens` per request, int64."""
    return _cap_array(np.asarray(prompt_tokens, dtype=np.int64), int(block_size), is_trace_rule(rule), False)


def cap_blocks_array(prompt_tokens: np.ndarray, block_size: int, rule: str) -> np.ndarray:
    """`cap_blocks` per request, int64."""
    return _cap_array(np.asarray(prompt_tokens, dtype=np.int64), int(block_size), is_trace_rule(rule), True)


def hit_tokens_array(k: np.ndarray, prompt_tokens: np.ndarray, block_size: int, rule: str) -> np.ndarray:
    """`hashing.hit_tokens` over arrays: min(k * B, cap), 0 where k is 0."""
    k = np.asarray(k, dtype=np.int64)
    return np.where(k > 0, block_tokens(k, block_size, cap_tokens_array(prompt_tokens, block_size, rule)), 0)
