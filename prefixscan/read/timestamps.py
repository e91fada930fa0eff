"""Timestamp parsing: ISO-8601 or RFC 2822 strings, or epoch numbers in s, ms, us or ns (by magnitude)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefixscan.redact import reject_detail

_UNITS = ((1e11, 1.0, "s"), (1e14, 1e-3, "ms"), (1e17, 1e-6, "us"), (float("inf"), 1e-9, "ns"))


def _unit(value: float) -> tuple[float, str]:
    """(seconds per unit, unit name) of an epoch number, guessed from its size (`epoch_number_to_seconds`)."""
    mag = abs(value)
    for limit, scale, name in _UNITS[:-1]:
        if mag < limit:
            return scale, name
    return _UNITS[-1][1:]  # nanoseconds (also NaN and infinities)


def epoch_number_to_seconds(value: float) -> float:
    """Epoch seconds from a number whose unit is guessed from its size.

    Values below 1e11 are seconds (up to year 5138), below 1e14 milliseconds, below 1e17 microseconds,
    otherwise nanoseconds. Small relative values (traces that start at 0) are therefore read as seconds.
    """
    return value * _unit(value)[0]


def _rfc2822(s: str) -> datetime:
    """An RFC 2822 date (`Mon, 20 Nov 2026 09:00:00 GMT`, as HTTP and mail headers write them)."""
    from email.utils import parsedate_to_datetime

    try:
        return parsedate_to_datetime(s)
    except (TypeError, ValueError, IndexError):
        raise ValueError(reject_detail("timestamp", "is neither ISO-8601, RFC 2822 nor an epoch number", s)) from None


def parse_timestamp(value: Any) -> float:
    """Seconds (epoch or relative) from a log's timestamp field; raises ValueError when unparseable."""
    if isinstance(value, bool) or value is None:
        raise ValueError(reject_detail("timestamp", "is not a time", value))
    if isinstance(value, (int, float)):
        if value != value:  # NaN
            raise ValueError(reject_detail("timestamp", "is NaN"))
        return epoch_number_to_seconds(float(value))
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
        return dt.timestamp()
    if isinstance(value, str):
        s = value.strip()
        if not s:
            raise ValueError(reject_detail("timestamp", "is empty"))
        try:
            return epoch_number_to_seconds(float(s))
        except ValueError:
            pass
        try:
            dt = datetime.fromisoformat(s.replace(" UTC", "+00:00"))
        except ValueError:
            dt = _rfc2822(s)
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return dt.timestamp()
    raise ValueError(reject_detail("timestamp", "is not a time", value))


def describe_timestamp(value: Any) -> str:
    """How `parse_timestamp` reads a value, for the summary: "epoch s" (ms, us, ns), "ISO-8601",
    "RFC 2822", "datetime" or "number string (epoch s)"."""
    if isinstance(value, datetime):
        return "datetime"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "epoch " + _unit(float(value))[1]
    if isinstance(value, str):
        s = value.strip()
        try:
            return "epoch " + _unit(float(s))[1] + " (as text)"
        except ValueError:
            pass
        try:
            datetime.fromisoformat(s.replace(" UTC", "+00:00"))
            return "ISO-8601"
        except ValueError:
            return "RFC 2822"
    return type(value).__name__
