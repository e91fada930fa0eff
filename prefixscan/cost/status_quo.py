"""The measured status quo: what the engine reported it cached, beside the modelled round robin, and why
the two differ, in sentences that follow from the numbers.

The gap is probed with more replays of round robin: at fewer replicas (is the log from a smaller
cluster?) when the engine cached more than modelled, and with unbounded KV (how much does eviction
cost?) when it cached less. Requests that report more cached tokens than an ideal cache could give them
mean the engine tokenizes or blocks differently.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixscan.cost.measure import EngineReported

AGREE_POINTS = 0.02  # within 2 points of token-weighted hit rate the model and the engine agree


@dataclass(frozen=True)
class StatusQuo:
    """Engine-reported status quo against the modelled round robin, with the explanation."""

    requests: int
    of_requests: int
    hit_rate_token_weighted: float
    hit_share_requests: float | None  # None when only the engine's counters are known
    round_robin_token_weighted: float | None
    replicas: int
    sweep: tuple[tuple[int, float], ...]  # (replicas, replayed round-robin token-weighted hit rate)
    round_robin_unbounded: float | None
    above_ideal_requests: int
    explanation: tuple[str, ...]
    source: str = "log"  # "log" (per-request counts) or "counters" (the engine's metrics)


def sweep_counts(replicas: int) -> list[int]:
    """Replica counts below `replicas` to replay round robin at: 1, 2, 3, 4, 6, 8, 12, 16, ..."""
    out, k = [], 1
    while k < replicas:
        out.append(k)
        k = k + 1 if k < 4 else (k * 3 // 2 if k & (k - 1) == 0 else k * 4 // 3)
    return out


def explain(e: EngineReported, of_requests: int, rr: float | None, replicas: int, kv_tokens: int,
            sweep: tuple[tuple[int, float], ...] = (), rr_unbounded: float | None = None) -> tuple[str, ...]:
    """Sentences comparing the engine's hit rate with the modelled round robin; each cites its numbers."""
    today = e.hit_rate_token_weighted
    subset = f" over the {e.requests:,} of {of_requests:,} requests that carry it" if e.requests < of_requests \
        else f" over all {e.requests:,} requests"
    if e.source == "counters":
        out = [f"The engine's {e.detail} report {today:.1%} of prompt tokens cached ({e.cached_tokens:,} of "
               f"{e.prompt_tokens:,})."]
    else:
        out = [f"The engine reported {today:.1%} of prompt tokens cached{subset}."]
    if e.above_ideal_requests:
        out.append(
            f"{e.above_ideal_requests:,} of them ({e.above_ideal_requests / e.requests:.0%}) report more cached "
            "tokens than an ideal cache could give them with this run's tokenizer and block size: the engine "
            "counts tokens differently (another tokenizer, chat template or block size), so compare rates, "
            "not token counts.")
    if rr is None:
        return (*out, "Round robin could not be replayed on this run, so the gap is not explained.")
    gap = today - rr
    base = f"Round robin replayed on {replicas} replicas caches {rr:.1%}"
    if abs(gap) <= AGREE_POINTS:
        out.append(f"{base}; the two agree within {AGREE_POINTS * 100:.0f} points, so the model fits this log.")
    elif gap > 0:
        out.append(_more(base, today, rr, replicas, kv_tokens, sweep, rr_unbounded))
    else:
        out.append(_less(base, -gap, replicas, kv_tokens, rr, rr_unbounded))
    return tuple(out)


def _more(base: str, today: float, rr: float, replicas: int, kv_tokens: int,
          sweep: tuple[tuple[int, float], ...], unbounded: float | None) -> str:
    text = f"{base}, {(today - rr) * 100:.1f} points less than the engine."
    memory = (f" More KV memory than the {kv_tokens:,} tokens per replica modelled would also explain it "
              f"(unbounded KV gives {unbounded:.1%})." if unbounded is not None and unbounded >= today -
              AGREE_POINTS else "")
    k, hk = min(((replicas, rr), *sweep), key=lambda kh: (abs(kh[1] - today), kh[0]))
    if k >= replicas or abs(hk - today) > AGREE_POINTS:
        return text + (memory or " Routing that is already sticky (session affinity) would explain it.")
    many = "s" if k > 1 else ""
    return (text + f" Replayed on {k} replica{many} it caches {hk:.1%}, the closest to the engine's figure: the "
            f"log most likely comes from about {k} replica{many}, fewer than the {replicas} assumed, or from "
            f"routing that is already sticky.{memory}")


def _less(base: str, gap: float, replicas: int, kv_tokens: int, rr: float, unbounded: float | None) -> str:
    text = f"{base}, {gap * 100:.1f} points more than the engine."
    if unbounded is not None and unbounded - rr > AGREE_POINTS:
        return (text + f" Eviction already costs the modelled round robin {(unbounded - rr) * 100:.1f} points "
                f"({unbounded:.1%} with unbounded KV), so less KV memory than the {kv_tokens:,} tokens per "
                "replica modelled (a lower gpu-memory-utilization, other models on the GPU) would explain it.")
    lost = "" if unbounded is None else (f" Eviction costs the modelled round robin only "
                                        f"{max(unbounded - rr, 0) * 100:.1f} points, so memory alone does not "
                                        "explain it.")
    return (text + lost + f" More replicas than the {replicas} assumed, prefix caching off for part of the "
            "traffic, or a different tokenizer or chat template (which moves block boundaries) would.")
