"""Pools of shared content: system prompts, documents, RAG chunks, templates, tool profiles, hot prefixes.

Each item is derived from (seed, kind, tenant, index) alone, never from generation order, so an item
evicted from the bounded cache and rebuilt later is byte-identical. That keeps memory constant while
millions of requests reuse a few thousand items.
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass
from functools import lru_cache

import orjson

from prefixscan.synth.plan import ToolProfile
from prefixscan.synth.text import corpus, question, words

TEXT_MODES = ("corpus", "fresh")


def zipf_cum_weights(n: int, s: float) -> list[float]:
    """Cumulative Zipf weights for `random.choices(cum_weights=...)`: item i has weight 1/(i+1)^s."""
    return list(itertools.accumulate(1.0 / (i + 1) ** s for i in range(n)))


@dataclass(frozen=True)
class SystemPrompt:
    """A system prompt split at its first paragraph, so a field can be injected after the intro."""

    prompt_id: str
    intro: str
    body: str


@dataclass(frozen=True)
class Template:
    """A prompt template with customer fields either at its top (cache-hostile) or after it."""

    template_id: str
    instruction: SystemPrompt
    fields: tuple[str, ...]
    fields_at_top: bool


_ROLES = {
    "chat": "a helpful customer assistant",
    "shared_prompt": "the vendor's general assistant, shared by every customer",
    "doc_qa": "a careful analyst who answers only from the attached document",
    "template": "a writer who fills in the customer's request from the template below",
    "rag": "a support assistant that answers from the retrieved passages",
    "agent": "an agent that uses the tools provided to complete tasks",
    "viral": "a commentator",
}

TEMPLATE_FIELDS = ("customer_name", "account_id", "plan", "language", "order_id", "region")
_PLANS = ("Free", "Pro", "Business", "Enterprise")
_LANGS = ("English", "Spanish", "French", "German", "Japanese", "Portuguese")
_REGIONS = ("us-east", "us-west", "eu-central", "ap-northeast", "sa-east")
_CHUNK_CW = zipf_cum_weights(400, 1.0)


@lru_cache(maxsize=65536)
def _account_id(tenant: str, user_index: int) -> str:
    return f"ACC-{random.Random(f'acct-{tenant}-{user_index}').randrange(10**7, 10**8)}"


class Content:
    """Deterministic content pools for one run, cached with a bounded LRU, and the text of every message.

    `text` "corpus" slices one fixed corpus (prefixscan.synth.text: cheap, but paragraphs recur across
    unrelated messages); "fresh" writes new text for every item and message (prefixscan.synth.fresh).
    """

    def __init__(self, seed: int, prompt_tokens: int, text: str = "corpus") -> None:
        self.seed = seed
        self.tokens = prompt_tokens
        self.fresh = None
        if text == "fresh":
            from prefixscan.synth.fresh import fresh

            self.fresh = fresh()
        else:
            self.corpus = corpus()
        self.system_prompt = lru_cache(maxsize=1024)(self._system_prompt)
        self.document = lru_cache(maxsize=256)(self._document)
        self.chunk = lru_cache(maxsize=4096)(self._chunk)
        self.template = lru_cache(maxsize=512)(self._template)
        self.tool_profile = lru_cache(maxsize=128)(self._tool_profile)
        self.hot_prefix = lru_cache(maxsize=16)(self._hot_prefix)
        self.retrieval = lru_cache(maxsize=8192)(self._retrieval)

    def _rng(self, *key: object) -> random.Random:
        return random.Random("-".join(map(str, (self.seed, *key))))

    def _prose(self, rng: random.Random, tokens: int) -> str:
        if self.fresh is not None:
            return self.fresh.prose(rng, max(8, tokens))
        return self.corpus.prose(rng, max(8, min(tokens, self.corpus.max_tokens())))

    def _document_text(self, rng: random.Random, tokens: int) -> str:
        """Long shared text (system prompt bodies, documents): structured markdown in fresh mode."""
        return self.fresh.document(rng, max(8, tokens)) if self.fresh is not None else self._prose(rng, tokens)

    def _words(self, rng: random.Random, k: int) -> str:
        return self.fresh.words(rng, k) if self.fresh is not None else words(rng, k)

    def question(self, rng: random.Random) -> str:
        """A user turn (fresh mode: short, heavy-tailed, sometimes with pasted code or text)."""
        return self.fresh.question(rng) if self.fresh is not None else question(rng)

    def answer(self, rng: random.Random, tokens: int) -> str:
        """An assistant answer of about `tokens` tokens (fresh mode: markdown with lists and code)."""
        return self.fresh.answer(rng, tokens) if self.fresh is not None else self.corpus.prose(rng, tokens)

    def tool_call(self, rng: random.Random, tool: str) -> str:
        """The JSON an agent's tool call carries."""
        if self.fresh is not None:
            args = {"query": self.fresh.words(rng, 2 + int(rng.random() * 6)), "limit": 1 + int(rng.random() * 50)}
            return orjson.dumps({"name": tool, "arguments": args}).decode()
        return f'{{"name": "{tool}", "arguments": {{"query": "{words(rng, 3)}"}}}}'

    def tool_result(self, rng: random.Random, tokens: int) -> str:
        """A tool's result of about `tokens` tokens (fresh mode: JSON records)."""
        return self.fresh.tool_result(rng, tokens) if self.fresh is not None else self.corpus.prose(rng, tokens)

    def _system_prompt(self, scope: str, scenario: str, index: int, share: float) -> SystemPrompt:
        """A system prompt of about `share` x prompt_tokens; `scope` is a tenant or 'global'."""
        rng = self._rng("sys", scope, scenario, index)
        who = f" for {scope}" if scope != "global" else ""
        intro = (f"You are {_ROLES[scenario]}{who}. Version {index}.{rng.randint(0, 9)} of these "
                 f"instructions. Follow them exactly.\n\n")
        body = self._document_text(rng, int(self.tokens * share * rng.uniform(0.8, 1.2)))
        return SystemPrompt(f"sys-{scope}-{scenario}-{index}", intro, body + "\n")

    def _document(self, tenant: str, index: int) -> tuple[str, str]:
        rng = self._rng("doc", tenant, index)
        doc_id = f"doc-{tenant}-{index:03d}"
        title = self._words(rng, 4).title()
        body = self._document_text(rng, int(self.tokens * rng.uniform(0.6, 1.0)))
        return doc_id, f'<document id="{doc_id}" title="{title}">\n{body}\n</document>\n\n'

    def _chunk(self, tenant: str, index: int) -> tuple[str, str]:
        rng = self._rng("chunk", tenant, index)
        chunk_id = f"chunk-{tenant}-{index:04d}"
        body = self._prose(rng, int(self.tokens * rng.uniform(0.08, 0.15)))
        return chunk_id, f"[source: {chunk_id}]\n{body}\n\n"

    def _template(self, tenant: str, index: int) -> Template:
        rng = self._rng("tpl", tenant, index)
        instruction = self._system_prompt(tenant, "template", index, 0.5)
        k = rng.randint(2, 4)
        fields = tuple(rng.sample(TEMPLATE_FIELDS, k))
        return Template(f"tpl-{tenant}-{index:02d}", instruction, fields, rng.random() < 0.4)

    def _tool_profile(self, tenant: str, index: int) -> ToolProfile:
        rng = self._rng("tools", tenant, index)
        tools = []
        budget = self.tokens * 0.4 * 4  # characters of JSON
        used = 0
        n = 0
        while used < budget or n < 3:
            name = "_".join(rng.choices(("get", "list", "create", "update", "search", "send", "cancel"), k=1)
                            + rng.choices(("order", "invoice", "ticket", "user", "shipment", "refund",
                                           "document", "calendar", "email", "report"), k=1)) + f"_{n}"
            props = {
                self._words(rng, 1).replace(" ", "_") + f"_{j}": {
                    "type": rng.choice(("string", "integer", "boolean")),
                    "description": self._words(rng, rng.randint(4, 12))}
                for j in range(rng.randint(1, 5))
            }
            tool = {"type": "function", "function": {
                "name": name,
                "description": self._prose(rng, rng.randint(20, 60)),
                "parameters": {"type": "object", "properties": props, "required": sorted(props)[:1]},
            }}
            tools.append(tool)
            used += len(orjson.dumps(tool))
            n += 1
        return ToolProfile(f"tools-{tenant}-{index}", tools, orjson.dumps(tools).decode())

    def _hot_prefix(self, index: int) -> tuple[str, str]:
        rng = self._rng("hot", index)
        hot_id = f"hot-{index}"
        body = self._prose(rng, int(self.tokens * 0.7))
        return hot_id, f"Everyone is sharing this post today. Read it carefully:\n\n\"{body}\"\n\n"

    def _retrieval(self, tenant: str, query: int, n_chunks: int) -> tuple[int, ...]:
        """The chunk indices (relevance order) a tenant's query retrieves: 4-6 distinct, Zipf-popular.

        Derived from (tenant, query) alone, so a popular query always retrieves the same layer and the
        number of distinct retrieved layers is bounded by the query pool, not by the request count.
        """
        rng = self._rng("retrieval", tenant, query)
        cum_weights = zipf_cum_weights(n_chunks, 1.0) if n_chunks != 400 else _CHUNK_CW
        k = rng.randint(4, 6)
        chosen: list[int] = []
        while len(chosen) < k:
            i = bisect.bisect(cum_weights, rng.random() * cum_weights[-1])
            if i not in chosen:
                chosen.append(i)
        return tuple(chosen)

    def template_value(self, field: str, tenant: str, user_index: int, rng: random.Random) -> tuple[str, bool]:
        """A customer field's value and whether it is stable per user (order ids are per request)."""
        from prefixscan.synth.text import person_name

        if field == "customer_name":
            return " ".join(person_name(user_index)), True
        if field == "account_id":
            return _account_id(tenant, user_index), True
        if field == "plan":
            return _PLANS[user_index % len(_PLANS)], True
        if field == "language":
            return _LANGS[(user_index // 4) % len(_LANGS)], True
        if field == "region":
            return _REGIONS[(user_index // 3) % len(_REGIONS)], True
        return f"ORD-{rng.randrange(10**9, 10**10)}", False
