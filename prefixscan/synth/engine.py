"""The event loop: merge new-session arrivals with pending follow-up turns, in time order, and inject
dynamic fields.

Only sessions in flight are held (a heap keyed by their next request time), so memory does not grow
with the number of requests. All randomness comes from generators seeded from the config's seed and
is consumed in a fixed order, so the same config yields the same plans.

Session arrivals are a Poisson process whose rate jumps during bursts: real traffic is not a flat
Poisson stream (a link goes viral, a batch job starts, and for some seconds the rate is several times
higher). Bursts are what stress a prefix-aware router (one hot prefix, one replica), so the generator
alternates calm and burst periods with exponential durations.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Iterator

from prefixscan.synth import drift
from prefixscan.synth.breakers import REGISTRY, BreakerSpec, Context, choose_spec, render
from prefixscan.synth.config import SynthConfig
from prefixscan.synth.content import Content, zipf_cum_weights
from prefixscan.synth.plan import CONV, SHARED, UNIQUE, Field, Part, Plan
from prefixscan.synth.scenarios import MEAN_REQUESTS, SCENARIOS, Env, pick
from prefixscan.synth.text import tenant_name


class Engine:
    """Produces the Plans of one synthetic run, in arrival order."""

    def __init__(self, config: SynthConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.content = Content(config.seed, config.prompt_tokens, config.text)
        self.tenants = [tenant_name(i) for i in range(config.tenants)]
        self.env = Env(self.content, config.model, config.prompt_tokens, config.users_per_tenant,
                       {t: i for i, t in enumerate(self.tenants)})
        self.names = [n for n, _ in config.scenarios]
        self.scenario_cw = list(itertools.accumulate(w for _, w in config.scenarios))
        self.tenant_cw = zipf_cum_weights(config.tenants, 0.7)
        self.user_cw = zipf_cum_weights(config.users_per_tenant, 0.8)
        self._specs: dict[str, tuple[BreakerSpec, ...]] = {}
        self._counters: dict[str, int] = {}
        self._drift_kinds: dict[str, str | None] = {}
        self.epoch = config.start_epoch()

    def mean_requests_per_session(self) -> float:
        total = self.scenario_cw[-1]
        return sum(MEAN_REQUESTS[n] * w for n, w in self.config.scenarios) / total

    def plans(self) -> Iterator[Plan]:
        """Yield `config.requests` plans in nondecreasing time order."""
        c = self.config
        rate = calm_rate(c.rps, self.mean_requests_per_session(), c.burst_every, c.burst_seconds,
                         c.burst_factor)
        stream = arrivals(random.Random(f"{c.seed}-arrivals"), rate, c.burst_every, c.burst_seconds,
                          c.burst_factor)
        viral_in_mix = "viral" in self.names
        pending: list[tuple[float, int, object]] = []
        order = itertools.count()
        next_time, in_burst = next(stream)
        for seq in range(c.requests):
            if pending and pending[0][0] <= next_time:
                t, _, session = heapq.heappop(pending)
            else:
                t = next_time
                session = self._new_session(in_burst and viral_in_mix)
                next(session)  # type: ignore[call-overload]
                next_time, in_burst = next(stream)
            plan: Plan = session.send(t)  # type: ignore[attr-defined]
            if plan.next_gap is not None:
                heapq.heappush(pending, (t + plan.next_gap, next(order), session))
            self._inject(plan, seq)
            if c.drift:
                self._drift(plan, seq)
            yield plan

    def _new_session(self, burst: bool) -> object:
        rng = self.rng
        f = self.config.burst_factor
        if burst and rng.random() < (f - 1) / f:
            name = "viral"  # the extra traffic of a burst is the viral prefix
        else:
            name = self.names[pick(rng, self.scenario_cw)]
        tenant = self.tenants[pick(rng, self.tenant_cw)]
        user = pick(rng, self.user_cw)
        return SCENARIOS[name](self.env, rng, tenant, user)

    def specs_for(self, source: str) -> tuple[BreakerSpec, ...]:
        """The breakers a prompt source injects, fixed per source as an application would."""
        specs = self._specs.get(source)
        if specs is None:
            specs = ()
            kinds = self.config.breakers
            r = random.Random(f"{self.config.seed}-breakers-{source}")
            if kinds and r.random() < self.config.breaker_rate:
                n = 2 if len(kinds) > 1 and r.random() < 0.3 else 1
                chosen: list[BreakerSpec] = []
                while len(chosen) < n:
                    spec = choose_spec(r, kinds)
                    if all(s.kind != spec.kind for s in chosen):
                        chosen.append(spec)
                specs = tuple(chosen)
            self._specs[source] = specs
        return specs

    def _drift(self, plan: Plan, seq: int) -> None:
        """Normalisation drift / template churn of the plan's prompt source (prefixscan.synth.drift)."""
        c = self.config
        if plan.source not in self._drift_kinds:
            self._drift_kinds[plan.source] = drift.choose(c.seed, plan.source, plan.scenario, c.drift, c.drift_rate)
        kind = self._drift_kinds[plan.source]
        plan.drift = drift.apply(plan, kind, seq, c.requests, c.seed) if kind else []

    def _inject(self, plan: Plan, seq: int) -> None:
        specs = self.specs_for(plan.source)
        if not specs:
            return
        count = self._counters.get(plan.source, 0) + 1
        self._counters[plan.source] = count
        ctx = Context(self.epoch + plan.time, seq, self.env.tenant_indices[plan.tenant] * 100_000
                      + plan.user_index, plan.tenant, plan.conversation_id, count, self.rng)
        for spec in specs:
            line, value, offset = render(spec, ctx)
            stability = REGISTRY[spec.kind].stability
            if spec.position == "user_tail":
                if plan.messages[-1][0] != "user":
                    continue  # an agent step ending in a tool result has no user tail this time
                line, offset = "\n" + line, offset + 1
            f = Field(spec.kind, "breaker", spec.label, value, offset, spec.form, spec.position)
            if stability in ("user", "day"):
                part = Part(line, ("line", line), SHARED, f)
            elif spec.position == "user_tail" and plan.conversation_id:
                part = Part(line, ("c", plan.conversation_id, "tail", seq), CONV, f)  # resent with history
            elif stability == "conversation" and plan.conversation_id:
                part = Part(line, ("c", plan.conversation_id, "line", line), CONV, f)
            else:
                part = Part(line, None, UNIQUE, f)
            if spec.position == "user_tail":
                plan.messages[-1][1].append(part)  # in place: the history resends what was sent
                continue
            role, parts = plan.messages[0]
            parts = list(parts)  # the system message object is shared by a session's turns
            if spec.position == "top":
                parts.insert(0, part)
            else:
                intro = next((i for i, p in enumerate(parts) if p.key is not None and p.key[0] == "sys"), -1)
                parts.insert(intro + 1, part)
            plan.messages[0] = (role, parts)


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
