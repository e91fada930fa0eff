"""Normalisation drift and template churn, injected with ground truth (off unless `--drift` names kinds).

Real fleets build "the same" prompt in several services: one sends CRLF, one NFD, one trailing spaces,
one serialises tool schemas with another key order or retrieved chunks in score order with ties broken
at random, or render a JSON list of tool definitions into the system prompt from an unordered mapping
(list order); and system prompts are edited between deploys (template churn). Each prompt source picks at
most one drift kind; a fixed share of its conversations (one service) sends the variant. The truth lists
where the variant first differs from the canonical text.
"""

from __future__ import annotations

import json
import random
import unicodedata
from typing import Any

from prefixscan.affixes import common_prefix_length
from prefixscan.synth.plan import Part, Plan, ToolProfile

DRIFT_KINDS = ("whitespace", "line_endings", "unicode", "json_key_order", "tool_order", "rag_order",
               "template_churn", "list_order")
TEXT_KINDS = ("whitespace", "line_endings", "unicode", "template_churn")
VARIANT_SHARE = 0.35
ACCENTED = "Brand voice: Café Zürich, crème brûlée, naïve façade.\n"
LIST_TOOLS = ("search_orders", "refund_payment", "lookup_customer", "open_ticket", "send_email", "get_invoice",
              "cancel_order", "track_parcel")


ONLY_IN = {"json_key_order": "agent", "tool_order": "agent", "rag_order": "rag"}  # kinds a scenario needs


def choose(seed: int, source: str, scenario: str, kinds: tuple[str, ...], rate: float) -> str | None:
    """The drift kind of one prompt source (fixed per source, like an application's code path)."""
    r = random.Random(f"{seed}-drift-{source}")
    ok = [k for k in kinds if ONLY_IN.get(k, scenario) == scenario]
    return r.choice(ok) if ok and r.random() < rate else None


def _reverse_keys(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _reverse_keys(obj[k]) for k in reversed(list(obj))}
    if isinstance(obj, list):
        return [_reverse_keys(v) for v in obj]
    return obj


def _entry(kind: str, mi: int, role: str, before: str, after: str, value: str) -> list[dict[str, Any]]:
    """The truth of one drift: where the variant's text (`after`) first differs from the canonical one."""
    return [{"kind": kind, "source": "drift", "message_index": mi, "role": role,
             "char_offset": common_prefix_length(before, after), "value": value, "label": "", "form": "",
             "position": "drift"}]


def _body(parts: list[Part]) -> int:
    """Index of the system prompt's body (the part after its intro), or the end."""
    return next((i for i, p in enumerate(parts) if p.key is not None and p.key[0] == "sys" and p.key[-1] == 1),
                len(parts))


def _system_edit(plan: Plan, edit: Any, tag: tuple) -> list[dict[str, Any]]:
    """Apply `edit(text) -> text` to the first field-free part after the intro; truth of the change."""
    role, parts = plan.messages[0]
    before = "".join(p.text for p in parts)
    new = list(parts)
    for i in range(len(new) - 1, -1, -1):
        p = new[i]
        if p.field is None and p.key is not None and p.key[0] == "sys" and p.key[-1] == 1:
            new[i] = Part(edit(p.text), ("drift", tag, p.key), p.scope)
            break
    else:
        return []
    plan.messages[0] = (role, new)
    after = "".join(p.text for p in new)
    return _entry(tag[0], 0, role, before, after, str(tag[1])) if after != before else []


def tool_list(seed: int, source: str, tenant: str) -> tuple[list[dict[str, Any]], bool]:
    """A prompt source's own tools rendered into its system prompt (5-8 objects keyed by `name`) and whether
    its tenant renders them indented (else compact: one serialiser per tenant, so two sources with the same
    tools never differ in layout alone)."""
    r = random.Random(f"{seed}-list-tools-{source}")
    names = sorted(r.sample(LIST_TOOLS, r.randint(5, 8)))
    return [{"name": n, "description": f"Call {n.replace('_', ' ')} (API v{r.randint(1, 9)}.{r.randint(0, 99)}) "
             "when the customer asks for it; never guess its arguments.",
             "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}
            for n in names], random.Random(f"{seed}-list-style-{tenant}").random() < 0.5


def _list_text(tools: list[dict[str, Any]], indent: bool) -> str:
    body = json.dumps(tools, indent=2) if indent else json.dumps(tools, separators=(",", ":"))
    return "Tools available in this conversation:\n" + body + "\n\n"


def _list_order(plan: Plan, seed: int, seq: int) -> list[dict[str, Any]]:
    """Insert the source's tool list before the system prompt's body, sorted by name (the canonical order);
    a share of conversations (one service, building it from an unordered mapping) sends it shuffled, in a
    seeded order per conversation. Truth: where the variant first differs from the sorted text."""
    role, parts = plan.messages[0]
    if role != "system" or any(p.key is not None and p.key[0] == "list" for p in parts):
        return []
    tools, indent = tool_list(seed, plan.source, plan.tenant)
    body = _body(parts)
    canonical = _list_text(tools, indent)
    who = plan.conversation_id or f"r{seq}"
    r = random.Random(f"{seed}-variant-{plan.source}-{who}")
    text = canonical
    if r.random() < VARIANT_SHARE:
        order = list(tools)
        while order == tools:
            r.shuffle(order)
        text = _list_text(order, indent)
    scope = parts[-1].scope
    plan.messages[0] = (role, [*parts[:body], Part(text, ("list", plan.source, text), scope), *parts[body:]])
    if text == canonical:
        return []
    head = "".join(p.text for p in parts[:body])
    return _entry("list_order", 0, role, head + canonical, head + text, "shuffled")


def _churn(text: str, version: int) -> str:
    cut = text.find(". ")
    cut = cut + 2 if cut >= 0 else 0
    return text[:cut] + f"This is revision {version} of the policy, so keep answers short and cite the section. " \
        + text[cut:]


def apply(plan: Plan, kind: str, seq: int, requests: int, seed: int) -> list[dict[str, Any]]:
    """Inject `kind` into `plan` (in place); returns the truth entries (empty for canonical requests)."""
    if kind == "unicode":  # every request of the source carries accented text; variants send it as NFD
        role, parts = plan.messages[0]
        if not any(p.key == ("accent",) for p in parts):
            body = _body(parts)
            plan.messages[0] = (role, [*parts[:body], Part(ACCENTED, ("accent",), parts[-1].scope), *parts[body:]])
    if kind == "list_order":  # every request of the source carries the list; variants send it shuffled
        return _list_order(plan, seed, seq)
    if kind == "template_churn":
        version = min(2, seq * 3 // max(requests, 1))
        if version == 0:
            return []
        return _system_edit(plan, lambda t: _churn(t, version), ("template_churn", version))
    who = plan.conversation_id or f"r{seq}"
    if random.Random(f"{seed}-variant-{plan.source}-{who}").random() >= VARIANT_SHARE:
        return []
    if kind == "whitespace":
        return _system_edit(plan, lambda t: t.replace(". ", ".  ", 1).replace("\n", "   \n", 1), ("whitespace", 1))
    if kind == "line_endings":
        return _system_edit(plan, lambda t: t.replace("\n", "\r\n"), ("line_endings", 1))
    if kind == "unicode":
        role, parts = plan.messages[0]
        before = "".join(p.text for p in parts)
        nfd = unicodedata.normalize("NFD", ACCENTED)
        new = [Part(nfd, ("accent-nfd",), p.scope) if p.key == ("accent",) else p for p in parts]
        plan.messages[0] = (role, new)
        return _entry("unicode", 0, role, before, "".join(p.text for p in new), "nfd")
    if kind in ("json_key_order", "tool_order") and plan.tools is not None:
        tools = plan.tools.tools
        new_tools = [_reverse_keys(t) for t in tools] if kind == "json_key_order" else tools[1:] + tools[:1]
        plan.tools = ToolProfile(plan.tools.profile_id + f"-{kind}", new_tools, plan.tools.json_text)
        return _entry(kind, -1, "tools", "", "", kind)
    if kind == "rag_order":
        role, parts = plan.messages[1]
        chunks = [i for i, p in enumerate(parts) if p.key is not None and p.key[0] == "chunk"]
        if len(chunks) < 2:
            return []
        before = "".join(p.text for p in parts)
        new = list(parts)
        a, b = chunks[0], chunks[1]
        new[a], new[b] = new[b], new[a]
        plan.messages[1] = (role, new)
        return _entry("rag_order", 1, role, before, "".join(p.text for p in new), "swapped")
    return []
