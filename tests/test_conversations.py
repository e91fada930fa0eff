"""Conversations inferred from message-prefix continuity: unit cases, a property test, and the sample log
with its conversation ids removed (precision and recall of the inferred pairs against the real ids)."""

from __future__ import annotations

import itertools
import json
import random
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

import prefixscan
from prefixscan.reuse.conversations import ConversationInference
from tests.conftest import ROOT, write_jsonl


def turn(system: str, dialogue: list[str]) -> list[dict]:
    roles = ["user", "assistant"]
    return [{"role": "system", "content": system}] + [{"role": roles[k % 2], "content": t}
                                                      for k, t in enumerate(dialogue)]


def test_continuation_tenant_and_dynamic_system_prompt() -> None:
    inf = ConversationInference()
    a1 = inf.assign("a1", "t", "m", turn("S", ["hi, I need help with my invoice"]))
    b1 = inf.assign("b1", "t", "m", turn("S", ["where is my parcel?"]))
    a2 = inf.assign("a2", "t", "m", turn("S", ["hi, I need help with my invoice", "Sure.", "number 12"]))
    other = inf.assign("x", "u", "m", turn("S", ["hi, I need help with my invoice", "Sure.", "number 12", "ok",
                                                 "thanks"]))
    b2 = inf.assign("b2", "t", "m", turn("S", ["where is my parcel?", "On its way.", "when?"]))
    assert (a1, a2) == ("inferred:a1", "inferred:a1") and (b1, b2) == ("inferred:b1", "inferred:b1")
    assert other == "inferred:x"  # another tenant never continues this tenant's conversation
    # a timestamp in the system prompt changes every turn: the dialogue still extends
    c1 = inf.assign("c1", "t", "m", turn("Time: 10:00:01", ["book a table for two"]))
    c2 = inf.assign("c2", "t", "m", turn("Time: 10:00:09", ["book a table for two", "Where?", "Rome"]))
    assert c2 == c1 == "inferred:c1"
    # the same opening question without the previous answer is a new conversation (dialogue chain)
    d = inf.assign("d", "t", "m", turn("Time: 10:00:12", ["book a table for two"])
                   + [{"role": "user", "content": "for tonight"}])
    assert d == "inferred:d"
    assert inf.inferred == 8 and inf.continued == 3


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.randoms(use_true_random=False))
def test_interleaved_conversations_are_recovered(n_conv: int, turns: int, rnd: random.Random) -> None:
    """Conversations with distinct openings, turns interleaved at random: exactly the real grouping."""
    steps = [c for c in range(n_conv) for _ in range(turns)]
    rnd.shuffle(steps)
    done = [0] * n_conv
    inf = ConversationInference()
    got: dict[int, set[str]] = defaultdict(set)
    for k, c in enumerate(steps):
        t = done[c]
        dialogue = [f"conversation {c} question 0"]
        for j in range(t):
            dialogue += [f"answer {c}.{j}", f"conversation {c} question {j + 1}"]
        got[c].add(inf.assign(f"r{k}", "t", "m", turn("S", dialogue)))
        done[c] += 1
    assert all(len(v) == 1 for v in got.values())
    assert len(set().union(*got.values())) == n_conv


def _pairs(ids: dict[str, str | None]) -> set[tuple[str, str]]:
    groups: dict[str, list[str]] = defaultdict(list)
    for r, c in ids.items():
        if c is not None:
            groups[c].append(r)
    return {p for g in groups.values() for p in itertools.combinations(sorted(g), 2)}


def test_sample_log_without_conversation_ids(tmp_path, capsys) -> None:
    src = ROOT / "sample_logs" / "chat.jsonl"
    recs = [json.loads(x) for x in src.read_text().splitlines()]
    for r in recs:
        r.pop("conversation_id", None)
    stripped = write_jsonl(tmp_path / "litellm_style.jsonl", recs)
    real = prefixscan.analyze(str(src), findings=False)
    inferred = prefixscan.analyze(str(stripped), findings=False)
    truth = dict(zip(real.tables["requests"]["request_id"].to_pylist(),
                     real.tables["requests"]["conversation_id"].to_pylist(), strict=True))
    req = inferred.tables["requests"]
    got = dict(zip(req["request_id"].to_pylist(), req["conversation_id"].to_pylist(), strict=True))
    assert all(req["conversation_inferred"].to_pylist())
    tp = len(_pairs(truth) & _pairs(got))
    precision, recall = tp / len(_pairs(got)), tp / len(_pairs(truth))
    with capsys.disabled():
        print(f"\nconversation inference on sample_logs/chat.jsonl without ids: same-conversation pairs "
              f"precision {precision:.3f}, recall {recall:.3f} ({tp} of {len(_pairs(truth))} real pairs, "
              f"{len(_pairs(got))} inferred)")
    assert precision >= 0.95 and recall >= 0.95
    for dim in ("by_hit_source", "by_prefix_class"):
        assert {k: v["cached_tokens"] for k, v in inferred.summary[dim].items()} == \
               {k: v["cached_tokens"] for k, v in real.summary[dim].items()}
    assert inferred.summary["conversations"]["inferred_requests"] == 400
    assert any("inferred from message-prefix continuity" in n for n in inferred.summary["notes"])
    off = prefixscan.analyze(str(stripped), findings=False, infer_conversations=False)
    assert off.tables["requests"]["conversation_id"].null_count == 400
    assert not any(off.tables["requests"]["conversation_inferred"].to_pylist())
    assert "same_conversation" not in off.summary["by_hit_source"]
    assert off.summary["by_hit_source"]["same_tenant"]["cached_tokens"] > \
        inferred.summary["by_hit_source"]["same_tenant"]["cached_tokens"]
