"""Brute-force references for the ideal-cache analysis: obviously correct, quadratic, for tests only."""

from __future__ import annotations

from collections.abc import Sequence

from prefixscan.encode.hashing import hit_tokens


def _common_blocks(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def ideal_reuse_ref(blocks: list[list[int]], prompt_tokens: list[int], block_size: int, rule: str,
                    tenants: list[str | None], conversations: list[str | None]) -> dict[str, list[int]]:
    """For each request, compare with every earlier request directly."""
    out: dict[str, list[int]] = {k: [] for k in ("k", "tokens", "tenant_tokens", "conv_tokens", "source")}
    for i, bi in enumerate(blocks):
        best, best_t, best_c, src = 0, 0, 0, -1
        for j in range(i):
            c = _common_blocks(bi, blocks[j])
            if c > best or (c == best and c > 0):
                best, src = c, j
            if tenants[j] == tenants[i]:
                best_t = max(best_t, c)
            if conversations[i] is not None and conversations[j] == conversations[i]:
                best_c = max(best_c, c)
        if best == 0:
            src = -1
        n = prompt_tokens[i]
        out["k"].append(best)
        out["tokens"].append(hit_tokens(best, n, block_size, rule))
        out["tenant_tokens"].append(hit_tokens(best_t, n, block_size, rule))
        out["conv_tokens"].append(hit_tokens(best_c, n, block_size, rule))
        out["source"].append(src)
    return out


def token_lcp_ref(tokens: list[list[int]], namespaces: list[int]) -> list[int]:
    """Exact longest common token prefix with any earlier request in the same namespace, capped at n-1."""
    res = []
    for i, t in enumerate(tokens):
        best = 0
        for j in range(i):
            if namespaces[j] == namespaces[i]:
                best = max(best, _common_blocks(t, tokens[j]))
        res.append(min(best, max(len(t) - 1, 0)))
    return res
