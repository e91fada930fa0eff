"""Session arrivals: a Poisson process whose rate jumps during bursts.

Real traffic is not a flat Poisson stream: a link goes viral, a batch job starts, and for some seconds the
rate is several times higher. Bursts are what stress a prefix-aware router (one hot prefix, one replica),
so the generator alternates calm and burst periods with exponential durations.
"""

from __future__ import annotations

import random
from collections.abc import Iterator


def arrivals(rng: random.Random, rate: float, burst_every: float, burst_seconds: float,
             burst_factor: float) -> Iterator[tuple[float, bool]]:
    """Yield (seconds since start, in_burst) forever. `rate` is the calm-period rate per second.

    Exponential gaps are memoryless, so when a gap would cross a period boundary we restart the draw at
    the boundary with the new rate; the result is an exact piecewise-constant-rate Poisson process.
    """
    t = 0.0
    in_burst = False
    bursts = burst_every > 0 and burst_seconds > 0 and burst_factor > 1
    switch = rng.expovariate(1 / burst_every) if bursts else float("inf")
    while True:
        current = rate * burst_factor if in_burst else rate
        gap = rng.expovariate(current)
        if t + gap >= switch:
            t = switch
            in_burst = not in_burst
            switch = t + rng.expovariate(1 / (burst_seconds if in_burst else burst_every))
            continue
        t += gap
        yield t, in_burst


def calm_rate(rps: float, mean_requests: float, burst_every: float, burst_seconds: float,
              burst_factor: float) -> float:
    """Calm-period session rate that makes the long-run request rate equal `rps`."""
    if burst_every > 0 and burst_seconds > 0 and burst_factor > 1:
        burst_share = burst_seconds / (burst_every + burst_seconds)
        boost = 1 + (burst_factor - 1) * burst_share
    else:
        boost = 1.0
    return rps / mean_requests / boost
