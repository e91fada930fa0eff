"""Prometheus scrapes of an engine's `/metrics`: the prefix-cache hit rate it served over a window.

vLLM counts prefix-cache queries and hits in tokens (`vllm:prefix_cache_queries_total`,
`vllm:prefix_cache_hits_total`; `vllm:gpu_prefix_cache_*` before the rename); SGLang counts prompt tokens
and cached tokens (`sglang:prompt_tokens_total`, `sglang:cached_tokens_total` by cache source). Counters
only grow, so the served rate over the logged window is the ratio of the deltas between a scrape taken
before and one taken after (docs/engines.md, 'What the engine reports'); the logged "hit rate" line is a
rolling window and is not used.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from prefixscan.errors import InputError

# (queries counter, hits counter) per engine, in the order they are tried.
COUNTERS = {
    "vllm": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
    "vllm-gpu": ("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"),
    "sglang": ("sglang:prompt_tokens_total", "sglang:cached_tokens_total"),
}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\d+)?$")
TOLERANCE_COVERAGE = 0.01  # the scrapes' query tokens must be within 1% of the log's prompt tokens


def parse_exposition(text: str) -> dict[str, float]:
    """Sum of every sample per metric name (all label sets), from the Prometheus text format.

    A name with the legacy unsuffixed spelling (`vllm:prefix_cache_queries`) is filed under `_total` too.
    """
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        name = m.group(1)
        if name.endswith("_created"):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


@dataclass(frozen=True)
class Served:
    """What the engine served over the window: query tokens, hit tokens, and which counters said so."""

    engine: str
    queries: float
    hits: float
    scrapes: int  # 2: a before/after delta; 1: counters since the engine started

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries > 0 else 0.0


def _counters(values: dict[str, float]) -> tuple[str, float, float] | None:
    for engine, (q, h) in COUNTERS.items():
        qv = values.get(q, values.get(q.removesuffix("_total")))
        hv = values.get(h, values.get(h.removesuffix("_total")))
        if qv is not None and hv is not None:
            return engine, qv, hv
    return None


def read_scrape(path: str | os.PathLike[str]) -> tuple[str, float, float]:
    """(engine, queries, hits) of one scrape file; an error naming the file when it has no such counters."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read metrics file {p}: {exc.strerror}") from None
    found = _counters(parse_exposition(text))
    if found is None:
        names = ", ".join(f"{q} and {h}" for q, h in COUNTERS.values())
        raise InputError(f"{p} has no prefix-cache counters (looked for {names}); scrape the engine's /metrics")
    return found


def served(paths: list[str]) -> Served:
    """The served window from one scrape (since start) or two (after minus before)."""
    if len(paths) not in (1, 2):
        raise InputError("give --metrics once (a scrape after the window) or twice (before, then after)")
    scrapes = [read_scrape(p) for p in paths]
    if len({s[0] for s in scrapes}) != 1:
        raise InputError("the two metrics scrapes come from different engines")
    engine, q, h = scrapes[-1]
    if len(scrapes) == 2:
        _, q0, h0 = scrapes[0]
        if q < q0 or h < h0:
            raise InputError(f"counters went down between {paths[0]} and {paths[1]}: the engine restarted, or "
                             "the files are in the wrong order (before first)")
        q, h = q - q0, h - h0
    return Served(engine, q, h, len(scrapes))


@dataclass(frozen=True)
class MetricsComparison:
    """Served (engine counters) against predicted (the run), with whether the windows line up."""

    served: Served
    log_prompt_tokens: int
    predicted_ideal: float
    measured_in_log: float | None  # the log's own engine-reported cached tokens, token-weighted

    @property
    def coverage(self) -> float:
        return self.served.queries / self.log_prompt_tokens if self.log_prompt_tokens else 0.0

    @property
    def same_window(self) -> bool:
        return abs(self.coverage - 1.0) <= TOLERANCE_COVERAGE

    def to_json(self) -> dict:
        return {"engine": self.served.engine, "scrapes": self.served.scrapes, "queries": self.served.queries,
                "hits": self.served.hits, "served_hit_rate": self.served.hit_rate,
                "log_prompt_tokens": self.log_prompt_tokens, "coverage": self.coverage,
                "same_window": self.same_window, "tolerance": TOLERANCE_COVERAGE,
                "predicted_ideal_hit_rate": self.predicted_ideal, "measured_in_log_hit_rate": self.measured_in_log}

    def sentences(self) -> list[str]:
        """What the comparison says, in words that follow from the numbers."""
        s, out = self.served, []
        out.append(f"engine counters ({s.engine}, {'before/after delta' if s.scrapes == 2 else 'since start'}): "
                   f"{s.hits:,.0f} of {s.queries:,.0f} prompt tokens hit the prefix cache ({s.hit_rate:.1%}); "
                   f"prefixscan's ideal cache: {self.predicted_ideal:.1%}")
        if not self.same_window:
            out.append(f"the counters cover {self.coverage:.1%} of the log's {self.log_prompt_tokens:,} prompt "
                       f"tokens (tolerance ±{TOLERANCE_COVERAGE:.0%}): the scrapes and the log are not the same "
                       "window, or the engine tokenises differently; compare rates, not tokens")
        if s.hit_rate > self.predicted_ideal + 1e-9:
            out.append("the engine served more hits than an ideal cache over this log allows: it saw traffic "
                       "outside the log (warm-up, other clients) or the log is missing requests")
        else:
            out.append(f"the engine is {100 * (self.predicted_ideal - s.hit_rate):.1f} points below the ideal "
                       "cache: finite KV memory and routing (see the capacity curve and `prefixscan simulate`)")
        return out
