"""The shared head and tail of two texts: where a varying span starts and ends (findings) and where an
edit lands in a record's raw text (fix)."""

from __future__ import annotations


def common_affixes(a: str, b: str) -> tuple[int, int]:
    """(shared prefix length, shared suffix length) of two strings, the suffix not overlapping the prefix."""
    n = min(len(a), len(b))
    p = 0
    while p < n and a[p] == b[p]:
        p += 1
    q = 0
    while q < n - p and a[-1 - q] == b[-1 - q]:
        q += 1
    return p, q
