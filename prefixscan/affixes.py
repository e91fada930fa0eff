"""The shared head and tail of two texts: where a varying span starts and ends (findings), where an
edit lands in a record's raw text (fix), where two token runs part (reuse) and where a drift edit starts
(synth truth)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def common_prefix_length(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items (characters, tokens) of `a` and `b` are equal."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def common_affixes(a: str, b: str) -> tuple[int, int]:
    """(shared prefix length, shared suffix length) of two strings, the suffix not overlapping the prefix."""
    n = min(len(a), len(b))
    p = common_prefix_length(a, b)
    q = 0
    while q < n - p and a[-1 - q] == b[-1 - q]:
        q += 1
    return p, q
