"""One session generator per scenario.

A session is a Python generator: the engine sends it the arrival time of its next request and it yields
that request's Plan (with `next_gap`, the think time before its next request, or None when it is done).
Generators keep a conversation's history as local state, so only conversations in flight use memory.
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from prefixscan.synth.content import Content, SystemPrompt, zipf_cum_weights
from prefixscan.synth.plan import CONV, SHARED, UNIQUE, Field, Part, Plan

Session = Generator[Plan, float, None]


@dataclass
class Env:
    """What every session needs: content pools, the model name, and a conversation counter."""

    content: Content
    model: str
    prompt_tokens: int
    users_per_tenant: int
    tenant_indices: dict[str, int]
    conversations: int = 0

    def new_conversation(self) -> str:
        self.conversations += 1
        return f"conv-{self.conversations:06d}"


def pick(rng: random.Random, cum_weights: list[float]) -> int:
    """Index drawn with the given cumulative weights (faster than random.choices for one draw)."""
    return bisect.bisect(cum_weights, rng.random() * cum_weights[-1])


# Standard log-normal quantiles (sigma 0.7, mean 1) at 4096 evenly spaced probabilities: drawing an index
# with one random() is several times cheaper than lognormvariate() on the hot path.
_LOGNORMAL = [math.exp(0.7 * statistics.NormalDist().inv_cdf((i + 0.5) / 4096) - 0.245) for i in range(4096)]


def output_tokens(rng: random.Random, mean: float, cap: int) -> int:
    """Log-normal output length with the given mean, at least 1 and at most max_tokens."""
    return max(1, min(cap, int(mean * _LOGNORMAL[int(rng.random() * 4096)])))


def system_parts(sp: SystemPrompt) -> list[Part]:
    """A system prompt as two shared parts, so a field can be injected after the intro."""
    return [Part(sp.intro, ("sys", sp.prompt_id, 0), SHARED), Part(sp.body, ("sys", sp.prompt_id, 1), SHARED)]


_CW = {n: zipf_cum_weights(n, 1.0) for n in (2, 4, 6, 40, 400)}
_CW[2000] = zipf_cum_weights(2000, 0.9)


def _plan(env: Env, t: float, scenario: str, tenant: str, user: int, messages: list, cap: int, mean: float,
          rng: random.Random, source: str, **kw: Any) -> Plan:
    return Plan(time=t, scenario=scenario, tenant=tenant, user_index=user, user=f"u-{user}", model=env.model,
                messages=messages, max_tokens=cap, output_tokens=output_tokens(rng, mean, cap), source=source,
                **kw)


def _multi_turn(env: Env, rng: random.Random, scenario: str, tenant: str, user: int, sp: SystemPrompt,
                turns: int, think: float, shared: dict) -> Session:
    """Chat that resends the whole history each turn, previous answers included."""
    conv = env.new_conversation()
    history: list[tuple[str, list[Part]]] = []
    sys_msg = ("system", system_parts(sp))
    t = yield  # type: ignore[misc]
    for turn in range(turns):
        # The same message object goes into the history, so a field appended to it at send time is resent.
        user_msg = ("user", [Part(env.content.question(rng) + "\n", ("c", conv, turn, "user"), CONV)])
        messages = [sys_msg, *history, user_msg]
        plan = _plan(env, t, scenario, tenant, user, messages, 1024, 220, rng, sp.prompt_id,
                     conversation_id=conv, turn_index=turn, shared=shared)
        last = turn == turns - 1
        plan.next_gap = None if last else rng.lognormvariate(math.log(think), 0.6)
        if not last:
            answer = env.content.answer(rng, plan.output_tokens)
            history = [*history, user_msg,
                       ("assistant", [Part(answer, ("c", conv, turn, "assistant"), CONV)])]
        t = yield plan


def chat(env: Env, rng: random.Random, tenant: str, user: int) -> Session:
    sp = env.content.system_prompt(tenant, "chat", pick(rng, _CW[4]), 0.5)
    turns = min(16, 1 + int(rng.expovariate(1 / 3.5)))
    return _multi_turn(env, rng, "chat", tenant, user, sp, turns, 25.0, {"system_prompt": sp.prompt_id})


def shared_prompt(env: Env, rng: random.Random, tenant: str, user: int) -> Session:
    sp = env.content.system_prompt("global", "shared_prompt", pick(rng, _CW[2]), 0.6)
    turns = min(6, 1 + int(rng.expovariate(1 / 1.2)))
    return _multi_turn(env, rng, "shared_prompt", tenant, user, sp, turns, 20.0,
                       {"system_prompt": sp.prompt_id, "cross_tenant": True})


def _single(plan_fn: Callable[[float], Plan]) -> Session:
    t = yield  # type: ignore[misc]
    yield plan_fn(t)


def doc_qa(env: Env, rng: random.Random, tenant: str, user: int) -> Session:
    sp = env.content.system_prompt(tenant, "doc_qa", 0, 0.03)
    doc_id, doc = env.content.document(tenant, pick(rng, _CW[40]))
    q = "Question: " + env.content.question(rng) + "\n"

    def make(t: float) -> Plan:
        msgs = [("system", system_parts(sp)), ("user", [Part(doc, ("doc", doc_id), SHARED), Part(q)])]
        return _plan(env, t, "doc_qa", tenant, user, msgs, 512, 150, rng, sp.prompt_id,
                     shared={"system_prompt": sp.prompt_id, "document": doc_id})
    return _single(make)


def rag(env: Env, rng: random.Random, tenant: str, user: int) -> Session:
    sp = env.content.system_prompt(tenant, "rag", pick(rng, _CW[2]), 0.25)
    # Popular queries retrieve the same chunks in the same order; the question text still varies.
    query = pick(rng, _CW[2000])
    chunks = [env.content.chunk(tenant, i) for i in env.content.retrieval(tenant, query, 400)]
    q = "Question: " + env.content.question(rng) + "\n"

    def make(t: float) -> Plan:
        parts = [Part("Retrieved context:\n\n", ("rag-head",), SHARED)]
        parts += [Part(text, ("chunk", cid), SHARED) for cid, text in chunks]
        parts.append(Part(q))
        msgs = [("system", system_parts(sp)), ("user", parts)]
        return _plan(env, t, "rag", tenant, user, msgs, 512, 180, rng, sp.prompt_id,
                     shared={"system_prompt": sp.prompt_id, "query": f"q-{tenant}-{query:04d}",
                             "chunks": [c for c, _ in chunks]})
    return _single(make)


def template(env: Env, rng: random.Random, tenant: str, user: int) -> Session:
    tpl = env.content.template(tenant, pick(rng, _CW[6]))
    env_user = env.tenant_indices[tenant] * 100_000 + user

    def make(t: float) -> Plan:
        field_parts = []
        for name in tpl.fields:
            value, stable = env.content.template_value(name, tenant, env_user, rng)
            label = name.replace("_", " ").capitalize()
            text = f"{label}: {value}\n"
            f = Field(name, "template", label, value, len(label) + 2, position="top" if tpl.fields_at_top
                      else "user")
            field_parts.append(Part(text, ("line", text), SHARED, f) if stable else Part(text, None, UNIQUE, f))
        task = Part("Task: " + env.content.question(rng) + "\n")
        sys = system_parts(tpl.instruction)
        if tpl.fields_at_top:
            msgs = [("system", field_parts + sys), ("user", [task])]
        else:
            msgs = [("system", sys), ("user", [*field_parts, task])]
        return _plan(env, t, "template", tenant, user, msgs, 512, 200, rng, tpl.template_id,
                     template_id=tpl.template_id, shared={"template": tpl.template_id})
    return _single(make)


def agent(env: Env, rng: random.Random, tenant: str, user: int) -> Session:
    """An agent loop: each step resends tools + history + the last tool result."""
    profile = env.content.tool_profile(tenant, pick(rng, _CW[2]))
    sp = env.content.system_prompt(tenant, "agent", 0, 0.15)
    steps = rng.randint(2, 6)
    conv = env.new_conversation()
    history: list[tuple[str, list[Part]]] = [("user", [Part("Task: " + env.content.question(rng) + "\n",
                                                            ("c", conv, 0, "user"), CONV)])]
    shared = {"system_prompt": sp.prompt_id, "tool_profile": profile.profile_id}
    sys_msg = ("system", system_parts(sp))
    t = yield  # type: ignore[misc]
    for step in range(steps):
        plan = _plan(env, t, "agent", tenant, user, [sys_msg, *history], 256, 80, rng,
                     sp.prompt_id, conversation_id=conv, turn_index=step, shared=shared, tools=profile)
        last = step == steps - 1
        plan.next_gap = None if last else rng.uniform(0.5, 4.0)
        if not last:
            tool = profile.tools[rng.randrange(len(profile.tools))]["function"]["name"]
            call = env.content.tool_call(rng, tool)
            result = env.content.tool_result(rng, rng.randint(60, 400))
            history = [*history, ("assistant", [Part(call, ("c", conv, step, "call"), CONV)]),
                       ("tool", [Part(result, ("c", conv, step, "result"), CONV)])]
        t = yield plan


def viral(env: Env, rng: random.Random, tenant: str, user: int) -> Session:
    hot_id, hot = env.content.hot_prefix(0 if rng.random() < 0.85 else 1)
    sp = env.content.system_prompt("global", "viral", 0, 0.02)
    q = env.content.question(rng) + "\n"

    def make(t: float) -> Plan:
        msgs = [("system", system_parts(sp)), ("user", [Part(hot, ("hot", hot_id), SHARED), Part(q)])]
        return _plan(env, t, "viral", tenant, user, msgs, 512, 120, rng, hot_id,
                     shared={"system_prompt": sp.prompt_id, "hot_prefix": hot_id, "cross_tenant": True})
    return _single(make)


SCENARIOS: dict[str, Callable[[Env, random.Random, str, int], Session]] = {
    "chat": chat,
    "shared_prompt": shared_prompt,
    "doc_qa": doc_qa,
    "template": template,
    "rag": rag,
    "agent": agent,
    "viral": viral,
}

# Expected requests per session, to turn a request rate into a session arrival rate.
MEAN_REQUESTS = {"chat": 4.2, "shared_prompt": 2.0, "doc_qa": 1.0, "template": 1.0, "rag": 1.0,
                 "agent": 4.0, "viral": 1.0}
