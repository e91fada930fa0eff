"""`prefixscan check RUN`: gates for CI, so a template change that breaks prefix reuse fails a build.

Each gate compares one number of the run with a threshold the user set; the result lists every gate,
passed or not, with the number it saw, so a failing build says exactly what moved.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from prefixscan.compare.facts import DEFINITIONS, Breaker, RunFacts, load_facts
from prefixscan.errors import UsageError

# Severity of a breaker: the share of the run's prompt tokens whose reuse it costs. A breaker that loses
# 5% of all prefill is worth a release blocker; one under 1% is a cleanup item.
SEVERITIES = ("low", "medium", "high")
SEVERITY_SHARE = {"high": 0.05, "medium": 0.01, "low": 0.0}


def severity(tokens_lost: int, prompt_tokens: int) -> str:
    """high >= 5% of the run's prompt tokens, medium >= 1%, low below (documented in docs/check.md)."""
    share = tokens_lost / prompt_tokens if prompt_tokens > 0 else 0.0
    if share >= SEVERITY_SHARE["high"]:
        return "high"
    return "medium" if share >= SEVERITY_SHARE["medium"] else "low"


@dataclass(frozen=True)
class Gate:
    """One check: what was compared, the value seen, the threshold, and whether it held. A gate the run
    cannot answer (breaker gates on a run without prompt text) is not checkable: it fails, unless the
    check allows it (`--allow-uncheckable`), and never counts as a pass."""

    name: str
    value: float | None
    threshold: float
    passed: bool
    message: str
    checkable: bool = True

    @property
    def status(self) -> str:
        """PASS, FAIL or NOT CHECKABLE, as the terminal lines and the JSON name it."""
        return "NOT CHECKABLE" if not self.checkable else "PASS" if self.passed else "FAIL"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "threshold": self.threshold, "passed": self.passed,
                "checkable": self.checkable, "status": self.status.lower().replace(" ", "_"),
                "message": self.message}


@dataclass(frozen=True)
class CheckResult:
    """All gates of one run; `passed` only when every gate held."""

    run: str
    gates: tuple[Gate, ...]

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    @property
    def failed(self) -> tuple[Gate, ...]:
        return tuple(g for g in self.gates if not g.passed)

    @property
    def uncheckable(self) -> tuple[Gate, ...]:
        return tuple(g for g in self.gates if not g.checkable)

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "passed": self.passed, "gates": [g.to_json() for g in self.gates]}


def _hit_gate(f: RunFacts, minimum: float, definition: str) -> Gate:
    if definition not in f.hit_rates:
        raise UsageError(f"run {f.path} has no {definition} hit rate (it has: {', '.join(sorted(f.hit_rates))})")
    v = f.hit_rates[definition]
    ok = v >= minimum
    word = "at least" if ok else "below"
    return Gate(f"min-hit-rate ({definition})", v, minimum, ok,
                f"{definition} hit rate {v:.2%} is {word} the minimum {minimum:.2%}")


def _breakers_of(f: RunFacts, gate: str) -> tuple[Breaker, ...]:
    if f.breakers is None:
        raise UsageError(f"{gate} needs findings, and run {f.path} has none (analysed with --no-findings or "
                         "from a hashed trace)")
    return f.breakers


def _not_checkable(f: RunFacts, name: str, threshold: float, allow: bool) -> Gate | None:
    """The gate `name` as not checkable when no breaker can be detected in the run (a hashed trace, token
    ids, completion prompts): "no breaker found" would be a pass that means nothing."""
    if f.uncheckable is None:
        return None
    return _uncheckable(name, threshold, f"run {f.path} {f.uncheckable}, so no cache breaker can be detected", allow)


def _uncheckable(name: str, threshold: float, why: str, allow: bool) -> Gate:
    """A gate the run cannot answer: it passes only when `--allow-uncheckable` allows it."""
    return Gate(name, None, threshold, allow, why + ("; allowed by --allow-uncheckable" if allow else
                                                     "; pass --allow-uncheckable to let the check pass without it"),
                checkable=False)


def _breaker_gate(f: RunFacts, maximum: int) -> Gate:
    total = sum(b.tokens_lost for b in _breakers_of(f, "--max-breaker-tokens"))
    ok = total <= maximum
    return Gate("max-breaker-tokens", float(total), float(maximum), ok,
                f"cache breakers cost {total:,} prompt tokens of reuse "
                f"({'within' if ok else 'over'} the maximum {maximum:,})")


def _severity_gate(f: RunFacts, level: str) -> Gate:
    floor = SEVERITIES.index(level)
    worst = [b for b in _breakers_of(f, "--fail-on") if SEVERITIES.index(severity(b.tokens_lost, f.prompt_tokens))
             >= floor]
    msg = (f"no breaker of severity {level} or above" if not worst else
           f"{len(worst)} breaker(s) of severity {level} or above; worst: {worst[0].kind}"
           f"{' (' + worst[0].label + ')' if worst[0].label else ''}, tenant {worst[0].tenant or '(none)'}, "
           f"{worst[0].tokens_lost:,} tokens ({severity(worst[0].tokens_lost, f.prompt_tokens)})")
    return Gate(f"fail-on {level}", float(len(worst)), 0.0, not worst, msg)


@dataclass(frozen=True)
class PilotGates:
    """The pilot's gates (docs/check.md): warm TTFT p95 (seconds), the predicted-minus-measured hit rate gap
    and the share of requests that left a warm candidate (fractions); None: not asked."""

    max_warm_ttft_p95: float | None = None
    max_prediction_gap: float | None = None
    max_left_warm: float | None = None

    def asked(self) -> bool:
        return any(v is not None for v in (self.max_warm_ttft_p95, self.max_prediction_gap, self.max_left_warm))

    def validate(self) -> None:
        if self.max_warm_ttft_p95 is not None and self.max_warm_ttft_p95 < 0:
            raise UsageError("--max-warm-ttft-p95 is in seconds, 0 or more (e.g. 0.25 for 250 ms)")
        for name, v in (("--max-prediction-gap", self.max_prediction_gap), ("--max-left-warm", self.max_left_warm)):
            if v is not None and not 0.0 <= v <= 1.0:
                raise UsageError(f"{name} is a fraction between 0 and 1 (e.g. 0.1 for 10%)")


def _pilot_value(f: RunFacts, gate: str) -> tuple[float | None, str | None]:
    """(the value a pilot gate reads, None and why when the run cannot answer it)."""
    p = f.pilot
    if gate == "max-warm-ttft-p95":
        warm = ((p or {}).get("by_class") or {}).get("warm") or {}
        if not p or not warm.get("ttft_requests"):
            return None, (f"run {f.path} has no warm request with a time to first token" if p else
                          f"run {f.path} carries no latency (no pilot measurement)")
        return warm["ttft_p95_s"], None
    if gate == "max-prediction-gap":
        pred = (p or {}).get("prediction")
        if not pred or pred["gap"]["hit_rate_points"] is None:
            return None, f"run {f.path} has no prediction next to outcome (no latency or no engine cached tokens)"
        return pred["gap"]["hit_rate_points"], None
    lw = ((p or {}).get("decisions") or {}).get("left_warm") or {}
    if lw.get("share") is None:
        return None, f"run {f.path} has no router decision log (analyze --decisions FILE)"
    return lw["share"], None


def _pilot_gate(f: RunFacts, gate: str, maximum: float, allow: bool) -> Gate:
    v, why = _pilot_value(f, gate)
    if v is None:
        return _uncheckable(gate, maximum, why or "", allow)
    ok = v <= maximum
    shown = {"max-warm-ttft-p95": (f"warm TTFT p95 {v * 1000:,.0f} ms", f"{maximum * 1000:,.0f} ms"),
             "max-prediction-gap": (f"predicted minus measured hit rate {v:+.2%}", f"{maximum:.2%}"),
             "max-left-warm": (f"share of decisions that left a warm candidate {v:.2%}", f"{maximum:.2%}")}[gate]
    return Gate(gate, v, maximum, ok, f"{shown[0]} is {'within' if ok else 'over'} the maximum {shown[1]}")


def check_run(run_dir: str | os.PathLike[str], min_hit_rate: float | None = None,
              definition: str = "token_weighted", max_breaker_tokens: int | None = None,
              fail_on: str | None = None, allow_uncheckable: bool = False,
              pilot: PilotGates = PilotGates()) -> CheckResult:
    """Evaluate the gates asked for; at least one must be asked (a check of nothing passes nothing).
    Breaker gates on a run without prompt text, and pilot gates on a run without the pilot's data, are
    not checkable: they fail unless `allow_uncheckable`."""
    if definition not in DEFINITIONS:
        raise UsageError(f"--definition must be one of {', '.join(DEFINITIONS)}")
    if min_hit_rate is not None and not 0.0 <= min_hit_rate <= 1.0:
        raise UsageError("--min-hit-rate is a fraction between 0 and 1 (e.g. 0.4 for 40%)")
    if max_breaker_tokens is not None and max_breaker_tokens < 0:
        raise UsageError("--max-breaker-tokens must be 0 or more")
    if fail_on is not None and fail_on not in SEVERITIES:
        raise UsageError(f"--fail-on must be one of {', '.join(SEVERITIES)}")
    pilot.validate()
    if min_hit_rate is None and max_breaker_tokens is None and fail_on is None and not pilot.asked():
        raise UsageError("nothing to check: give --min-hit-rate, --max-breaker-tokens, --fail-on, "
                         "--max-warm-ttft-p95, --max-prediction-gap or --max-left-warm")
    f = load_facts(run_dir)
    gates = []
    if min_hit_rate is not None:
        gates.append(_hit_gate(f, min_hit_rate, definition))
    if max_breaker_tokens is not None:
        gates.append(_not_checkable(f, "max-breaker-tokens", float(max_breaker_tokens), allow_uncheckable)
                     or _breaker_gate(f, max_breaker_tokens))
    if fail_on is not None:
        gates.append(_not_checkable(f, f"fail-on {fail_on}", 0.0, allow_uncheckable) or _severity_gate(f, fail_on))
    for gate, maximum in (("max-warm-ttft-p95", pilot.max_warm_ttft_p95),
                          ("max-prediction-gap", pilot.max_prediction_gap), ("max-left-warm", pilot.max_left_warm)):
        if maximum is not None:
            gates.append(_pilot_gate(f, gate, maximum, allow_uncheckable))
    return CheckResult(str(run_dir), tuple(gates))
