"""`synth --text fresh`: text that does not repeat across unrelated messages, deterministic, realistic shapes.

The corpus mode slices one fixed corpus, so paragraphs recur across unrelated conversations; benchmarks on
such logs measure a tokenizer memo's hits that real traffic would not give. These tests pin what fresh
mode promises instead, and check the corpus mode really is different (so the checks can fail).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from prefixscan.errors import UsageError
from prefixscan.synth import SynthConfig, generate, write
from prefixscan.synth.engine import Engine
from prefixscan.synth.plan import CONV, SHARED

MIN_WORDS = 8  # a "paragraph" worth checking: shorter ones (headings, "Thanks!") may recur in real traffic
# Fixed wording of the generator's own templates (allowed to recur, as an application's templates do).
TEMPLATE_TEXT = {"Everyone is sharing this post today. Read it carefully:"}
FRESH = SynthConfig(requests=600, seed=3, prompt_tokens=600, tenants=4, text="fresh", breakers=())


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if len(p.split()) >= MIN_WORDS]


def repeats_across_conversations(records: list[dict]) -> list[str]:
    """Paragraphs of non-system messages seen in two conversations, or of system prompts and tool lists
    seen in two tenants (a tenant's system prompts and tools are shared within it on purpose)."""
    owners: dict[str, set[str]] = defaultdict(set)
    for r in records:
        conv = r.get("conversation_id") or r["request_id"]
        for m in r["messages"]:
            owner = "tenant:" + r["tenant"] if m["role"] == "system" else "conv:" + conv
            for p in paragraphs(m["content"]):
                owners[p].add(owner)
        for p in paragraphs(orjson.dumps(r.get("tools") or []).decode().replace("},{", "}\n\n{")):
            owners[p].add("tenant:" + r["tenant"])
    return [p for p, who in owners.items() if len(who) > 1]


def test_fresh_log_repeats_no_paragraph_across_conversations() -> None:
    cfg = SynthConfig(**{**FRESH.__dict__, "scenarios": (("chat", 3.0), ("agent", 1.0))})
    records = list(generate(cfg))
    assert {r["conversation_id"] for r in records}.__len__() > 100
    assert repeats_across_conversations(records) == []


def test_corpus_log_does_repeat_paragraphs() -> None:
    """The same check on the corpus mode finds repeats: the check can fail, and fresh mode is the fix."""
    cfg = SynthConfig(**{**FRESH.__dict__, "scenarios": (("chat", 3.0), ("agent", 1.0)), "text": "corpus"})
    assert len(repeats_across_conversations(list(generate(cfg)))) > 10


def test_every_scenario_shares_text_only_through_shared_items() -> None:
    """Over all scenarios, a paragraph belongs to one owner: one shared item (system prompt, document,
    chunk, template, hot prefix), one conversation's history, or one request."""
    cfg = SynthConfig(**{**FRESH.__dict__, "requests": 800})
    owners: dict[str, set[object]] = defaultdict(set)
    for seq, plan in enumerate(Engine(cfg).plans()):
        for _, parts in plan.messages:
            for p in parts:
                owner = (("shared", p.key) if p.scope == SHARED else
                         ("conv", plan.conversation_id) if p.scope == CONV else ("request", seq))
                for para in paragraphs(p.text):
                    owners[para].add(owner)
    shared = [p for p, who in owners.items() if len(who) > 1 and p not in TEMPLATE_TEXT]
    assert len(owners) > 2000
    assert shared == []


def test_fresh_same_seed_same_bytes_and_corpus_stays_the_default(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    write(FRESH, str(a))
    write(FRESH, str(b))
    write(SynthConfig(**{**FRESH.__dict__, "seed": 4}), str(c))
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    assert SynthConfig().text == "corpus"
    corpus = tmp_path / "d.jsonl"
    write(SynthConfig(**{**FRESH.__dict__, "text": "corpus"}), str(corpus))
    assert corpus.read_bytes() != a.read_bytes()


def test_fresh_message_shapes() -> None:
    """User turns short with a long tail, answers longer, tools as JSON schemas, tool results as JSON."""
    cfg = SynthConfig(**{**FRESH.__dict__, "requests": 1500, "scenarios": (("chat", 3.0), ("agent", 1.0))})
    user, assistant, results = [], [], []
    for r in generate(cfg):
        if r.get("tools"):
            fn = r["tools"][0]["function"]
            assert fn["parameters"]["type"] == "object" and fn["parameters"]["properties"]
        for m in r["messages"]:
            words = len(m["content"].split())
            if m["role"] == "user" and not m["content"].startswith("Task: "):
                user.append(words)
            elif m["role"] == "assistant" and not m["content"].startswith("{"):
                assistant.append(words)
            elif m["role"] == "tool":
                results.append(orjson.loads(m["content"]))
    assert statistics.median(user) < 60 < max(user)  # short turns, heavy tail (pasted text or code)
    assert statistics.median(assistant) > 2 * statistics.median(user)
    assert results and all(r["status"] == "ok" and isinstance(r["items"], list) for r in results)


def test_fresh_analyze_tokenises_at_least_the_uncached_tokens(tmp_path: Path) -> None:
    """On fresh text the memo cannot beat the ideal cache: prefixscan tokenises at least the uncached
    tokens, less at most the block rounding (a request's last partial block counts as uncached although its
    text was tokenised before). Breakers are off: text after a changed field is uncached but memoised."""
    cfg = SynthConfig(requests=250, seed=5, prompt_tokens=800, tenants=3, text="fresh", breakers=(),
                      scenarios=(("chat", 1.0),))
    log = tmp_path / "fresh.jsonl"
    write(cfg, str(log), truth_path=None)
    r = prefixscan.analyze(str(log))
    req = r.tables["requests"]
    prompt = sum(req.column("prompt_tokens").to_pylist())
    uncached = prompt - sum(req.column("cached_tokens").to_pylist())
    tokenised = r.summary["input"]["tokenizer_stats"]["tokens_tokenised"]
    block = 16
    assert tokenised >= uncached - (block - 1) * req.num_rows
    assert tokenised <= 1.5 * uncached  # and not much more: each new message is tokenised once


def test_cli_text_option(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    res = CliRunner().invoke(app, ["synth", "-o", str(out), "-n", "20", "--text", "fresh", "-q"])
    assert res.exit_code == 0, res.output
    assert out.exists()
    res = CliRunner().invoke(app, ["synth", "-o", str(out), "-n", "20", "--text", "poetry"])
    assert res.exit_code == 2 and "unknown --text 'poetry'" in res.output
    assert "--text" in CliRunner().invoke(app, ["synth", "--help"]).output
    with pytest.raises(UsageError):
        SynthConfig(text="poetry")
