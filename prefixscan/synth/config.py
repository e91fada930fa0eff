"""The synth configuration and the parsing of its textual options (shared by the CLI and the library)."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Collection
from dataclasses import dataclass

from prefixscan.errors import UsageError
from prefixscan.synth.breakers import CLASSIC_KINDS, DEFAULT_KINDS, REGISTRY, TEXT_KINDS
from prefixscan.synth.content import TEXT_MODES
from prefixscan.synth.scenarios import SCENARIOS

DEFAULT_MIX: tuple[tuple[str, float], ...] = (
    ("chat", 3.0), ("shared_prompt", 1.0), ("doc_qa", 2.0), ("template", 2.0), ("rag", 2.0), ("agent", 1.0),
    ("viral", 0.5),
)
FORMATS = ("jsonl", "jsonl.gz", "parquet", "mooncake")


@dataclass(frozen=True)
class SynthConfig:
    """Everything that determines a synthetic log; equal configs give byte-identical files."""

    requests: int = 1000
    seed: int = 0
    scenarios: tuple[tuple[str, float], ...] = DEFAULT_MIX
    tenants: int = 3
    rps: float = 5.0
    prompt_tokens: int = 2000
    breakers: tuple[str, ...] = DEFAULT_KINDS
    breaker_rate: float = 0.3
    start: str = "2026-11-29T10:00:00Z"
    id_prefix: str = ""  # prepended to request and conversation ids, so several logs can be analysed together
    model: str = "llama-3.1-8b-instruct"
    users_per_tenant: int = 200
    burst_every: float = 300.0
    burst_seconds: float = 10.0
    burst_factor: float = 5.0
    drift: tuple[str, ...] = ()  # normalisation drift / template churn kinds (prefixscan.synth.drift)
    drift_rate: float = 0.3
    # "corpus": prose sliced from one fixed corpus (paragraphs recur across unrelated messages; the default,
    # so existing logs stay byte-identical); "fresh": new text for every message (prefixscan.synth.fresh).
    text: str = "corpus"

    def __post_init__(self) -> None:
        if self.requests < 0:
            raise UsageError(f"--requests must be >= 0, got {self.requests}")
        if not 1 <= self.tenants <= 10_000:
            raise UsageError(f"--tenants must be between 1 and 10000, got {self.tenants}")
        if not self.rps > 0:
            raise UsageError(f"--rps must be > 0, got {self.rps}")
        if not 64 <= self.prompt_tokens <= 200_000:
            raise UsageError(f"--prompt-tokens must be between 64 and 200000, got {self.prompt_tokens}")
        if not self.scenarios:
            raise UsageError("no scenario selected; use --scenario all or name one of: " + ", ".join(SCENARIOS))
        for name, weight in self.scenarios:
            _known((name,), SCENARIOS, "scenario", ", ".join(SCENARIOS) + ", all")
            if not weight > 0:
                raise UsageError(f"scenario weight must be > 0, got {name}={weight}")
        _known(self.breakers, REGISTRY, "breaker kind", ", ".join(REGISTRY))
        if not 0.0 <= self.breaker_rate <= 1.0:
            raise UsageError(f"--breaker-rate must be between 0 and 1, got {self.breaker_rate}")
        from prefixscan.synth.drift import DRIFT_KINDS

        _known(self.drift, DRIFT_KINDS, "drift kind", ", ".join(DRIFT_KINDS))
        if not 0.0 <= self.drift_rate <= 1.0:
            raise UsageError(f"--drift-rate must be between 0 and 1, got {self.drift_rate}")
        if self.text not in TEXT_MODES:
            raise UsageError(f"unknown --text {self.text!r}; choose from: {', '.join(TEXT_MODES)}")
        if self.users_per_tenant < 1:
            raise UsageError("--users-per-tenant must be >= 1")
        if self.burst_factor < 1 or self.burst_every < 0 or self.burst_seconds < 0:
            raise UsageError("burst settings must be non-negative and the burst factor >= 1")
        self.start_epoch()

    def start_epoch(self) -> float:
        """The start time as epoch seconds (UTC), from an ISO-8601 'YYYY-MM-DDTHH:MM:SS[.fff]Z' string."""
        m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(\.\d+)?(Z|\+00:00)?", self.start)
        if not m:
            raise UsageError(f"--start must look like 2026-11-29T10:00:00Z, got {self.start!r}")
        base = calendar.timegm(time.strptime(f"{m[1]} {m[2]}", "%Y-%m-%d %H:%M:%S"))
        return base + (float(m[3]) if m[3] else 0.0)


def parse_scenarios(values: list[str] | tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """Parse repeatable --scenario values: 'all', 'chat', 'chat=3', or comma lists 'chat=3,rag=1'."""
    if not values:
        return DEFAULT_MIX
    mix: dict[str, float] = {}
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            name, _, weight_text = item.partition("=")
            try:
                weight = float(weight_text) if weight_text else 1.0
            except ValueError:
                raise UsageError(f"bad scenario weight in {item!r}; write name=number, e.g. chat=3") from None
            if name == "all":
                for n, w in DEFAULT_MIX:
                    mix[n] = w * weight
                continue
            _known((name,), SCENARIOS, "scenario", ", ".join(SCENARIOS) + ", all")
            mix[name] = weight
    return tuple(mix.items())


def parse_drift(value: str) -> tuple[str, ...]:
    """Parse --drift: 'off' (default), 'all', or a comma list of prefixscan.synth.drift.DRIFT_KINDS."""
    from prefixscan.synth.drift import DRIFT_KINDS

    v = value.strip().lower()
    if v in ("off", "none", "no", "false", ""):
        return ()
    if v == "all":
        return DRIFT_KINDS
    kinds = tuple(k.strip() for k in v.split(",") if k.strip())
    _known(kinds, DRIFT_KINDS, "drift kind", "off, all, " + ", ".join(DRIFT_KINDS))
    return kinds


def parse_breakers(value: str) -> tuple[str, ...]:
    """Parse --breakers: 'on' (the default kinds), 'all' (every field-line kind), 'text' (dates and times in
    words, in lines or sentences), 'off', or a comma list (which may include 'all' and 'text')."""
    v = value.strip().lower()
    if v in ("on", "default", "yes", "true"):
        return DEFAULT_KINDS
    if v in ("off", "none", "no", "false", ""):
        return ()
    groups = {"all": CLASSIC_KINDS, "text": TEXT_KINDS}
    kinds = tuple(dict.fromkeys(x for k in v.split(",") if k.strip()
                                for x in groups.get(k.strip(), (k.strip(),))))
    _known(kinds, REGISTRY, "breaker kind", "on, off, all, text, " + ", ".join(REGISTRY))
    return kinds


def _known(kinds: tuple[str, ...], known: Collection[str], what: str, choices: str) -> None:
    """A UsageError naming the first of `kinds` not in `known` and the `choices` the option accepts."""
    for kind in kinds:
        if kind not in known:
            raise UsageError(f"unknown {what} {kind!r}; choose from: {choices}")
