"""What `check` and `diff` read from a run directory: hit rates, tokens, breakers, per-group rows.

One loader, so the gate and the comparison can never disagree about what a run says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from prefixscan.detect.reader import uncheckable
from prefixscan.errors import RunDirError
from prefixscan.run.load import Run, load_run

# The hit-rate definitions a run reports (docs/definitions.md, 'Hit rates'), as named in the manifest.
DEFINITIONS = ("token_weighted", "block_weighted", "request_mean", "steady_state_token_weighted",
               "steady_state_block_weighted", "steady_state_request_mean", "tenant_isolated_token_weighted")
# Findings that are not prompt breakers. Runs written before the miss attribution (the `misses` table)
# listed the gap between predicted and engine-reported cached tokens as a finding of this category; its
# causes are outside the prompt (routing, eviction, tokenizer), so gates and diffs of such runs skip it.
NOT_BREAKERS = ("actual_vs_predicted",)
GROUPS = ("tenant", "prefix_class", "hit_source", "model")


@dataclass(frozen=True)
class Breaker:
    """One finding as the gates see it: identity (for matching across runs) and what it costs."""

    kind: str
    tenant: str | None
    label: str | None
    message_index: int | None
    role: str | None
    tokens_lost: int
    requests_affected: int
    fix: str

    @property
    def key(self) -> tuple[Any, ...]:
        """Same breaker in two runs: same kind, tenant, field label and message (offsets may move)."""
        return (self.kind, self.tenant, self.label, self.message_index, self.role)


@dataclass(frozen=True)
class RunFacts:
    """The numbers of one run that gates and diffs use."""

    path: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    hit_rates: dict[str, float]
    groups: dict[str, dict[str, dict[str, float]]]  # dimension -> key -> {requests, prompt, cached, rate}
    breakers: tuple[Breaker, ...] | None  # None: the run has no findings table
    block_size: int
    tokenizer: str
    extra: dict[str, Any] = field(default_factory=dict)
    uncheckable: str | None = None  # why no breaker can be detected (detect.reader.uncheckable), None: it can
    pilot: dict[str, Any] | None = None  # the analyze summary's `pilot` section (docs/pilot.md); None: no latency


def _breakers(run: Run) -> tuple[Breaker, ...] | None:
    if not run.has("findings"):
        return None
    return tuple(Breaker(r["kind"], r["tenant"], r["label"], r["message_index"], r["role"], int(r["tokens_lost"]),
                         int(r["requests_affected"]), r["fix"])
                 for r in sorted(run.table("findings").to_pylist(), key=lambda r: r["rank"])
                 if r["category"] not in NOT_BREAKERS)


def _groups(run: Run) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {g: {} for g in GROUPS}
    if not run.has("summaries"):
        return out
    for r in run.table("summaries").to_pylist():
        if r["dimension"] in out:
            out[r["dimension"]][str(r["key"])] = {
                "requests": int(r["requests"]), "prompt_tokens": int(r["prompt_tokens"]),
                "cached_tokens": int(r["cached_tokens"]), "token_weighted": float(r["token_weighted"]),
            }
    return out


def load_facts(run_dir: str | os.PathLike[str]) -> RunFacts:
    """Read one run; a run that `analyze` did not finish is an error naming the directory."""
    run = load_run(run_dir)
    analyze = run.manifest.get("analyze")
    if not analyze:
        raise RunDirError(f"{run_dir} has no analyze results in its manifest; re-run `prefixscan analyze`")
    summary = analyze.get("summary") or {}
    tokens = summary.get("tokens") or {}
    reqs = summary.get("requests") or {}
    rates = {k: float(v) for k, v in (analyze.get("hit_rate") or {}).items() if k in DEFINITIONS and v is not None}
    config = run.manifest.get("config") or {}
    return RunFacts(
        path=str(run_dir), requests=int(reqs.get("accepted", 0)), prompt_tokens=int(tokens.get("prompt", 0)),
        cached_tokens=int(tokens.get("cached", 0)), hit_rates=rates, groups=_groups(run), breakers=_breakers(run),
        block_size=int(config.get("block_size") or 0), tokenizer=str(config.get("tokenizer") or ""),
        uncheckable=uncheckable(run), pilot=summary.get("pilot"),
    )
