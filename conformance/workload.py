"""Seeded chat workloads that stress the edges of tokenisation and prefix caching.

Multi-turn conversations of several tenants (three with a vLLM `cache_salt`, one without, two tenants
sharing the same system prompt under different salts), tool definitions, exact resends, and text that
tokenizers merge in surprising ways: symbols before blank lines, CRLF, tabs, emoji with joiners, CJK,
combining marks, and one very long paragraph. Some requests are padded until their prompt is an exact
multiple of 32 tokens (so also of 16) with the family's own tokenizer and chat template, the case where
vLLM's n-1 cap decides the hit. Same seed and tokenizer, same bytes out.

Usage: python conformance/workload.py TOKENIZER_DIR OUT.jsonl [--seed 7] [--conversations 40]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

EDGES = [
    "_\n\n", ":\n\n", ".)\n\n", "?!\n\n", "```\n\n", "—\n\n", ";\n\n\n", "  \n\n", "9\n\n", ")\n\n", "]\n\n",
    "\r\n", "\r\n\r\n", "\t", "\t\t", "👍🏽", "🧑‍💻", "🇯🇵", "日本語のテキストです。", "中文标点，测试。\n\n",
    "한국어 문장", "e\u0301", "n\u0303o", "Z\u0351\u0352\u0353", "مرحبا بالعالم", "ÅÄÖ åäö", "ﬁ", "x²+y²",
    "\u00a0", "$\n\n", "}\n\n", "'\n\n", '"\n\n', "...\n\n", "-\n\n", "*\n\n", "#\n\n", "<\n\n", "&amp;\n\n", "\\n\n\n",
]
WORDS = ("the invoice order shipment account refund policy customer ticket region report value status agent "
         "model request answer review balance contract period support update record detail summary").split()
TENANTS = [("acme", "salt-acme"), ("globex", "salt-globex"), ("initech", None), ("umbrella", "salt-umbrella")]
TOOLS = [
    {"type": "function", "function": {"name": "lookup_order", "description": "Find an order by id.",
                                      "parameters": {"type": "object", "properties": {"id": {"type": "string"}},
                                                     "required": ["id"]}}},
    {"type": "function", "function": {"name": "refund", "description": "Refund part of an order.",
                                      "parameters": {"type": "object", "properties": {
                                          "id": {"type": "string"}, "amount": {"type": "number"}}}}},
]


def sentence(rng: random.Random, n: int) -> str:
    """n words, sometimes with an edge string glued in."""
    out = []
    for _ in range(n):
        out.append(rng.choice(WORDS))
        if rng.random() < 0.12:
            out.append(rng.choice(EDGES))
    return " ".join(out).replace(" \n", "\n")


def paragraph_text(rng: random.Random, paragraphs: int) -> str:
    """Paragraphs separated by blank lines, each ending in a symbol the tokenizer may merge with them."""
    parts = []
    for _ in range(paragraphs):
        end = rng.choice(["_", ":", ".)", ".", "?", "!", ";", "`", "]", "", " ", "\t", "。"])
        parts.append(sentence(rng, rng.randint(4, 30)) + end)
    sep = rng.choice(["\n\n", "\n\n", "\r\n\r\n", "\n\n\n", "\n \n"])
    return sep.join(parts)


def system_prompts(rng: random.Random) -> dict[str, str]:
    """One system prompt per tenant; acme and globex share one text (their salts must keep them apart)."""
    shared = "You are a support assistant.\n\n" + paragraph_text(rng, 6)
    long_para = " ".join(rng.choice(WORDS) for _ in range(900)) + "."  # one very long paragraph
    return {"acme": shared, "globex": shared,
            "initech": "Rules:\n\n" + long_para + "\n\n" + paragraph_text(rng, 2),
            "umbrella": "Sistema: respond briefly.\t\n\n" + paragraph_text(rng, 4)}


class Padder:
    """Pads a message until the rendered prompt is a multiple of `multiple` tokens (the family's template)."""

    def __init__(self, tokenizer_dir: str, multiple: int = 32) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.multiple = multiple

    def length(self, messages: list[dict[str, str]], tools: list[Any] | None) -> int:
        text = self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return len(self.tok.encode(text, add_special_tokens=False))

    def pad(self, messages: list[dict[str, str]], tools: list[Any] | None) -> bool:
        """Append filler words to the last message; True when an exact multiple was reached."""
        base = messages[-1]["content"]
        for k in range(0, 3 * self.multiple):
            messages[-1]["content"] = base + " ok" * k
            if self.length(messages, tools) % self.multiple == 0:
                return True
        messages[-1]["content"] = base
        return False


def conversations(rng: random.Random, count: int, padder: Padder | None) -> list[list[dict[str, Any]]]:
    """Each conversation as the list of its requests (every turn resends the whole history)."""
    systems = system_prompts(rng)
    convs = []
    for c in range(count):
        tenant, salt = TENANTS[c % len(TENANTS)]
        tools = TOOLS if rng.random() < 0.3 else None
        history = [{"role": "system", "content": systems[tenant]}]
        reqs = []
        for turn in range(rng.randint(1, 6)):
            history.append({"role": "user", "content": paragraph_text(rng, rng.randint(1, 3))})
            msgs = [dict(m) for m in history]
            if padder is not None and rng.random() < 0.25:
                padder.pad(msgs, tools)
                history[-1] = dict(msgs[-1])
            reqs.append({"tenant": tenant, "cache_salt": salt, "conversation_id": f"c{c:03d}", "turn_index": turn,
                         "messages": msgs, "tools": tools})
            if rng.random() < 0.12:  # an exact resend (a retry): a capped full hit
                reqs.append(dict(reqs[-1]))
            history.append({"role": "assistant", "content": sentence(rng, rng.randint(3, 25))})
        convs.append(reqs)
    return convs


def interleave(rng: random.Random, convs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Turns of different conversations interleaved (each conversation stays in order)."""
    queues = [list(c) for c in convs]
    out = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        out.append(q.pop(0))
    return out


def generate(tokenizer_dir: str | None, seed: int = 7, count: int = 60) -> list[dict[str, Any]]:
    """The workload's records in log order (one request every 10 s, so none overlap in the engine)."""
    rng = random.Random(seed)
    padder = Padder(tokenizer_dir) if tokenizer_dir else None
    recs = interleave(rng, conversations(rng, count, padder))
    out = []
    for i, r in enumerate(recs):
        rec = {"request_id": f"q{i:04d}", "timestamp": 1_700_000_000 + 10 * i, "model": "tiny", "output_tokens": 1}
        rec.update({k: v for k, v in r.items() if v is not None})
        out.append(rec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokenizer_dir")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--conversations", type=int, default=60)
    a = ap.parse_args()
    recs = generate(a.tokenizer_dir, a.seed, a.conversations)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", encoding="utf-8", newline="\n") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
    print(f"{a.out}: {len(recs)} requests")


if __name__ == "__main__":
    main()
