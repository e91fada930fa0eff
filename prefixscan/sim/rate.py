"""The traffic rate a log shows: its mean over the busy periods, so idle gaps do not dilute it.

A log is often a sample: two 2-minute bursts a day apart, or one busy hour per shift. Its mean rate
(requests / span) then says more about when it was sampled than about the traffic. The rule, in one place
(`estimate`, `report` and `simulate --rps` all use it):

- sort the arrivals; a gap between two consecutive requests is *idle* when it is longer than
  `GAP_FACTOR` (10) times the median inter-arrival time and longer than `GAP_MIN_S` (60 s);
- busy time = span - the idle gaps; the log is *gappy* when the idle gaps are more than `GAPPY_SHARE`
  (10%) of its span;
- the log's rate is requests / busy time on a gappy log, requests / span otherwise (so a steady log's
  rate is exactly what it always was); when the busy time is zero (every busy period is a single
  instant) the rate cannot be measured and the caller asks for `--rps`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GAP_FACTOR = 10.0  # an idle gap is longer than this many median inter-arrival times ...
GAP_MIN_S = 60.0  # ... and longer than this many seconds
GAPPY_SHARE = 0.1  # idle gaps above this share of the span make the log gappy


@dataclass(frozen=True)
class Activity:
    """When a log's requests arrived: its span, its busy time and its idle gaps."""

    requests: int
    span_s: float
    busy_s: float  # span minus the idle gaps (== span_s on a log that is not gappy)
    idle_gaps: int
    gap_threshold_s: float

    @property
    def gappy(self) -> bool:
        return self.span_s > 0 and self.span_s - self.busy_s > GAPPY_SHARE * self.span_s

    @property
    def busy_fraction(self) -> float:
        """Share of the span the rate is measured over: 1 on a log that is not gappy, 0 when unmeasurable."""
        if not self.gappy:
            return 1.0
        return self.busy_s / self.span_s

    @property
    def mean_rps(self) -> float:
        """Requests over the whole span (NaN when every request shares one instant)."""
        return self.requests / self.span_s if self.span_s > 0 else float("nan")

    @property
    def rps(self) -> float:
        """The log's rate by the module's rule (NaN when it cannot be measured)."""
        if not self.gappy:
            return self.mean_rps
        return self.requests / self.busy_s if self.busy_s > 0 else float("nan")

    def summary(self) -> str | None:
        """'the log spans 24.0 h but is busy for 3.8 min (...)' on a gappy log, else None."""
        if not self.gappy:
            return None
        return (f"the log spans {duration(self.span_s)} but is busy for {duration(self.busy_s)} "
                f"({self.idle_gaps:,} idle gap(s) longer than {duration(self.gap_threshold_s)})")

    def note(self) -> str | None:
        """What a reader must be told when the busy-period rate replaces the mean (None when it does not)."""
        if not self.gappy:
            return None
        if self.busy_s <= 0:
            return (f"the log spans {duration(self.span_s)} but its requests come in isolated instants between "
                    "idle gaps, so no rate can be measured from it")
        return (f"{self.summary()}: using the busy-period rate {self.rps:,.3g} req/s, not the mean "
                f"{self.mean_rps:,.3g} req/s; pass --rps to set the traffic's rate")


def activity(arrivals: np.ndarray | list[float]) -> Activity:
    """Busy time and idle gaps of a log's arrival times (seconds, any order)."""
    t = np.sort(np.asarray(arrivals, dtype=np.float64))
    n = len(t)
    if n < 2:
        return Activity(n, 0.0, 0.0, 0, GAP_MIN_S)
    gaps = np.diff(t)
    span = float(t[-1] - t[0])
    threshold = max(GAP_FACTOR * float(np.median(gaps)), GAP_MIN_S)
    idle = gaps[gaps > threshold]
    return Activity(n, span, span - float(idle.sum()), int(len(idle)), threshold)


def duration(seconds: float) -> str:
    """60 s -> '1.0 min', 86,700 s -> '24.1 h': the unit a reader thinks in."""
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds:,.1f} s"
