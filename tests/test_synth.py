"""Tests for `prefixscan synth`: determinism, record schema, ground truth, multi-turn and Mooncake semantics."""

from __future__ import annotations

import gzip
import math
import re
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.errors import UsageError
from prefixscan.synth import (
    REGISTRY,
    SCENARIOS,
    SynthConfig,
    generate,
    generate_mooncake,
    generate_with_truth,
    parse_breakers,
    parse_scenarios,
    write,
)
from prefixscan.synth.breakers import CLASSIC_KINDS, LINE_STYLES, TEXT_KINDS, BreakerSpec, Context, render

SMALL = SynthConfig(requests=300, seed=7, prompt_tokens=300, tenants=3, breaker_rate=0.5,
                    breakers=tuple(REGISTRY))
ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
MULTI_TURN = {"chat", "shared_prompt", "agent"}
PER_REQUEST = {k for k, v in REGISTRY.items() if v.stability == "request"}


@pytest.fixture(scope="module")
def pairs() -> list[tuple[dict, dict]]:
    return list(generate_with_truth(SMALL))


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return [orjson.loads(line) for line in f]


# ------------------------------------------------------------------ determinism


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet", "mooncake"])
def test_same_seed_gives_byte_identical_files(tmp_path: Path, fmt: str) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write(SMALL, str(a), fmt)
    write(SMALL, str(b), fmt)
    write(SynthConfig(**{**SMALL.__dict__, "seed": 8}), str(c), fmt)
    assert a.read_bytes() == b.read_bytes()
    assert Path(f"{a}.truth.jsonl").read_bytes() == Path(f"{b}.truth.jsonl").read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_generate_matches_written_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    result = write(SMALL, str(path))
    assert read_jsonl(path) == list(generate(SMALL))
    assert result.requests == SMALL.requests == len(read_jsonl(path))
    assert len(read_jsonl(Path(result.truth_path))) == SMALL.requests


def test_zero_requests_writes_empty_files(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    result = write(SynthConfig(requests=0), str(path))
    assert path.read_bytes() == b"" and result.requests == 0


# ------------------------------------------------------------------ record schema


def test_record_schema(pairs: list[tuple[dict, dict]]) -> None:
    last_ts = ""
    for i, (rec, truth) in enumerate(pairs):
        keys = list(rec)
        expected = ["request_id", "timestamp", "tenant"]
        expected += ["conversation_id"] if truth["scenario"] in MULTI_TURN else []
        expected += ["user", "model", "messages"]
        expected += ["tools"] if truth["scenario"] == "agent" else []
        expected += ["max_tokens", "output_tokens"]
        assert keys == expected
        assert rec["request_id"] == f"req-{i + 1:06d}" == truth["request_id"]
        assert ISO.match(rec["timestamp"]) and rec["timestamp"] >= last_ts
        last_ts = rec["timestamp"]
        assert rec["messages"][0]["role"] == "system"
        for m in rec["messages"]:
            assert set(m) == {"role", "content"} and m["role"] in {"system", "user", "assistant", "tool"}
            assert isinstance(m["content"], str) and m["content"]
        assert 1 <= rec["output_tokens"] <= rec["max_tokens"]
        if "tools" in rec:
            assert all(t["type"] == "function" and t["function"]["name"] for t in rec["tools"])
        assert truth["tenant"] == rec["tenant"] and truth["conversation_id"] == rec.get("conversation_id")


def test_all_scenarios_and_tenants_appear(pairs: list[tuple[dict, dict]]) -> None:
    assert {t["scenario"] for _, t in pairs} == set(SCENARIOS)
    assert len({r["tenant"] for r, _ in pairs}) == 3


def test_shared_prompt_is_shared_across_tenants(pairs: list[tuple[dict, dict]]) -> None:
    tenants_by_prompt: dict[str, set[str]] = {}
    for rec, truth in pairs:
        if truth["scenario"] == "shared_prompt":
            tenants_by_prompt.setdefault(truth["shared_prefix"]["system_prompt"], set()).add(rec["tenant"])
    assert max(len(t) for t in tenants_by_prompt.values()) >= 2


def test_prompt_size_follows_prompt_tokens() -> None:
    def mean_chars(tokens: int) -> float:
        recs = list(generate(SynthConfig(requests=200, seed=1, prompt_tokens=tokens, breakers=())))
        return sum(len(m["content"]) for r in recs for m in r["messages"]) / len(recs)

    assert mean_chars(4000) > 4 * mean_chars(500)


# ------------------------------------------------------------------ ground truth


def test_truth_offsets_point_at_values(pairs: list[tuple[dict, dict]]) -> None:
    kinds = set()
    for rec, truth in pairs:
        for f in truth["fields"]:
            msg = rec["messages"][f["message_index"]]
            assert msg["role"] == f["role"]
            assert msg["content"][f["char_offset"]:].startswith(f["value"]), f
            assert f["label"] in msg["content"][max(0, f["char_offset"] - len(f["label"]) - 12):f["char_offset"]]
            kinds.add(f["kind"])
    assert {"timestamp", "request_id", "user_name"} <= kinds


def test_top_breakers_sit_at_the_start_of_the_system_prompt(pairs: list[tuple[dict, dict]]) -> None:
    seen = 0
    for _, truth in pairs:
        for f in truth["fields"]:
            if f["source"] == "breaker" and f["position"] == "top":
                assert f["message_index"] == 0 and f["char_offset"] < 80
                seen += 1
    assert seen > 0


def test_breakers_off_injects_nothing() -> None:
    cfg = SynthConfig(requests=200, seed=3, prompt_tokens=200, breakers=())
    assert all(f["source"] == "template" for _, t in generate_with_truth(cfg) for f in t["fields"])


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_every_breaker_form_renders_its_value(kind: str) -> None:
    import random

    ctx = Context(1_795_000_000.25, 5, 42, "acme", "conv-000001", 17, random.Random(0))
    entry = REGISTRY[kind]
    assert len(entry.labels) >= 3 and any(not label.isascii() for label in entry.labels)
    for form in entry.forms:
        for style in LINE_STYLES:
            spec = BreakerSpec(kind, entry.labels[-1], form, style, "top")
            line, value, offset = render(spec, ctx)
            assert value and line[offset:].startswith(value) and entry.labels[-1] in line[:offset]


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), tenants=st.integers(1, 5), tokens=st.integers(64, 600))
def test_truth_offsets_property(seed: int, tenants: int, tokens: int) -> None:
    cfg = SynthConfig(requests=60, seed=seed, tenants=tenants, prompt_tokens=tokens, breaker_rate=0.8,
                      breakers=tuple(REGISTRY))
    for rec, truth in generate_with_truth(cfg):
        for f in truth["fields"]:
            assert rec["messages"][f["message_index"]]["content"][f["char_offset"]:].startswith(f["value"])


# ------------------------------------------------------------------ multi-turn


def test_multi_turn_histories_are_prefixes_of_later_turns(pairs: list[tuple[dict, dict]]) -> None:
    last: dict[str, tuple[dict, dict]] = {}
    checked = whole = 0
    for rec, truth in pairs:
        conv = rec.get("conversation_id")
        if conv is None:
            continue
        if conv in last:
            prev, prev_truth = last[conv]
            assert truth["turn_index"] == prev_truth["turn_index"] + 1
            n = len(prev["messages"])
            assert len(rec["messages"]) >= n + 1
            # Everything after the system message is resent verbatim, previous answers included.
            assert rec["messages"][1:n] == prev["messages"][1:]
            if truth["scenario"] != "agent":
                assert rec["messages"][n]["role"] == "assistant"
            volatile = any(f["kind"] in PER_REQUEST and f["message_index"] == 0 for f in truth["fields"])
            if not volatile:
                assert rec["messages"][:n] == prev["messages"]
                whole += 1
            checked += 1
        else:
            assert truth["turn_index"] == 0
        last[conv] = (rec, truth)
    assert checked > 50 and whole > 20


def test_interleaved_conversations_in_time_order(pairs: list[tuple[dict, dict]]) -> None:
    convs = [r["conversation_id"] for r, _ in pairs if "conversation_id" in r]
    first_switch = next(i for i in range(1, len(convs)) if convs[i] != convs[i - 1])
    assert len(set(convs[: first_switch + 20])) > 2  # conversations overlap rather than run one by one


# ------------------------------------------------------------------ formats


def test_parquet_round_trip(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "x.parquet"
    write(SMALL, str(path), "parquet")
    table = pq.read_table(path)
    assert table.schema.field("messages").type == pa.list_(
        pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert table.schema.field("tools").type == pa.string()
    rows = table.to_pylist()
    for row, rec in zip(rows, generate(SMALL), strict=True):
        assert row["messages"] == rec["messages"] and row["request_id"] == rec["request_id"]
        assert row["conversation_id"] == rec.get("conversation_id")
        assert (orjson.loads(row["tools"]) if row["tools"] else None) == rec.get("tools")


def test_jsonl_gz_is_gzip_of_jsonl(tmp_path: Path) -> None:
    write(SMALL, str(tmp_path / "a.jsonl"), "jsonl")
    write(SMALL, str(tmp_path / "a.jsonl.gz"), "jsonl.gz")
    assert gzip.decompress((tmp_path / "a.jsonl.gz").read_bytes()) == (tmp_path / "a.jsonl").read_bytes()


def test_mooncake_block_semantics() -> None:
    lines = list(generate_mooncake(SynthConfig(requests=1500, seed=2, prompt_tokens=1500, breaker_rate=0.4)))
    context: dict[int, tuple[int, int]] = {}  # id -> (position, previous id): equal id => equal prefix
    next_new = 0
    last_ts = 0
    for line in lines:
        assert list(line) == ["timestamp", "input_length", "output_length", "hash_ids"]
        ids = line["hash_ids"]
        assert len(ids) == math.ceil(line["input_length"] / 512)
        assert line["timestamp"] >= last_ts
        last_ts = line["timestamp"]
        for pos, h in enumerate(ids):
            key = (pos, ids[pos - 1] if pos else -1)
            assert context.setdefault(h, key) == key
            if h >= next_new:  # new ids appear in order of first appearance
                assert h == next_new
                next_new += 1
    assert next_new < sum(len(x["hash_ids"]) for x in lines) * 0.7  # there is real reuse


def test_mooncake_and_jsonl_describe_the_same_requests() -> None:
    cfg = SynthConfig(requests=200, seed=4, prompt_tokens=400)
    mc = list(generate_mooncake(cfg))
    recs = list(generate(cfg))
    for m, r in zip(mc, recs, strict=True):
        assert m["output_length"] == r["output_tokens"]
        chars = sum(len(x["content"]) for x in r["messages"])
        assert chars / 4 <= m["input_length"] <= chars / 4 + 4 * len(r["messages"]) + 2000
    assert mc[0]["timestamp"] < 10_000


def test_mooncake_conversation_turns_extend_previous_blocks() -> None:
    cfg = SynthConfig(requests=400, seed=5, prompt_tokens=1200, scenarios=(("chat", 1.0),), breakers=())
    by_conv: dict[str, list[int]] = {}
    extended = 0
    for m, r in zip(generate_mooncake(cfg), generate(cfg), strict=True):
        prev = by_conv.get(r["conversation_id"])
        if prev is not None:
            full = prev[:-1] if len(prev) > 1 else []
            assert m["hash_ids"][: len(full)] == full
            extended += 1
        by_conv[r["conversation_id"]] = m["hash_ids"]
    assert extended > 100


# ------------------------------------------------------------------ options and CLI


@pytest.mark.parametrize("bad", [
    {"requests": -1}, {"tenants": 0}, {"rps": 0}, {"prompt_tokens": 10}, {"scenarios": (("nope", 1.0),)},
    {"scenarios": (("chat", 0.0),)}, {"breakers": ("nope",)}, {"breaker_rate": 2.0}, {"start": "yesterday"},
])
def test_bad_config_raises_usage_error(bad: dict) -> None:
    with pytest.raises(UsageError):
        SynthConfig(**bad)


def test_parse_options() -> None:
    assert parse_scenarios(["chat=3,rag", "agent"]) == (("chat", 3.0), ("rag", 1.0), ("agent", 1.0))
    assert {n for n, _ in parse_scenarios(["all"])} == set(SCENARIOS)
    assert parse_breakers("off") == () and parse_breakers("all") == CLASSIC_KINDS
    assert parse_breakers("text") == TEXT_KINDS and set(parse_breakers("all,text")) == set(REGISTRY)
    assert parse_breakers("timestamp,email") == ("timestamp", "email")
    for bad in (["chat=x"], ["foo"]):
        with pytest.raises(UsageError):
            parse_scenarios(bad)
    with pytest.raises(UsageError):
        parse_breakers("timestamp,bogus")


@pytest.mark.parametrize("args", [
    ["--scenario", "bogus"], ["--format", "xml"], ["--requests", "-5"], ["--breakers", "nope"],
    ["--prompt-tokens", "3"], ["--scenario", "chat=abc"], ["--tenants", "0"],
])
def test_cli_bad_options_exit_2(tmp_path: Path, args: list[str]) -> None:
    result = CliRunner().invoke(app, ["synth", "-o", str(tmp_path / "x.jsonl"), *args])
    assert result.exit_code == 2
    assert "prefixscan: error:" in result.output


def test_cli_writes_log_and_default_truth(tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    result = CliRunner().invoke(app, ["synth", "-o", str(out), "--requests", "50", "--seed", "3",
                                      "--scenario", "chat=2,rag", "--prompt-tokens", "200", "--json"])
    assert result.exit_code == 0, result.output
    summary = orjson.loads(result.stdout)
    assert summary["requests"] == 50 and set(summary["by_scenario"]) <= {"chat", "rag"}
    assert summary["truth_path"] == f"{out}.truth.jsonl"
    assert len(read_jsonl(out)) == 50 and len(read_jsonl(Path(f"{out}.truth.jsonl"))) == 50


def test_cli_no_truth_and_custom_truth(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "a.jsonl"
    assert runner.invoke(app, ["synth", "-o", str(out), "-n", "10", "--no-truth", "-q"]).exit_code == 0
    assert not Path(f"{out}.truth.jsonl").exists()
    truth = tmp_path / "t.jsonl"
    args = ["synth", "-o", str(out), "-n", "10", "--truth", str(truth), "-q", "--force"]
    assert runner.invoke(app, args).exit_code == 0
    assert len(read_jsonl(truth)) == 10


# ------------------------------------------------------------------ arrivals and memory


def test_arrivals_have_bursts_and_the_requested_mean_rate() -> None:
    import random

    from prefixscan.synth.engine import arrivals

    stream = arrivals(random.Random(1), rate=2.0, burst_every=60.0, burst_seconds=10.0, burst_factor=5.0)
    calm = burst = 0
    t = 0.0
    while t < 20_000:
        t, in_burst = next(stream)
        burst += in_burst
        calm += not in_burst
    burst_share = 10 / 70
    expected_burst = 5 * burst_share / (5 * burst_share + (1 - burst_share))
    assert abs(burst / (calm + burst) - expected_burst) < 0.05
    cfg = SynthConfig(requests=3000, seed=1, rps=8.0, prompt_tokens=100, breakers=())
    plans = list(generate_mooncake(cfg))
    assert 6.0 < len(plans) / (plans[-1]["timestamp"] / 1000) < 10.5


def test_block_mapper_forgets_finished_conversations() -> None:
    from prefixscan.synth.engine import Engine
    from prefixscan.synth.mooncake import BlockMapper

    mapper = BlockMapper()
    engine = Engine(SynthConfig(requests=3000, seed=2, prompt_tokens=200))
    in_flight: set[str] = set()
    for plan in engine.plans():
        mapper.map(plan)
        if plan.conversation_id:
            (in_flight.discard if plan.next_gap is None else in_flight.add)(plan.conversation_id)
    assert set(mapper._conv_paths) == in_flight
    assert set(mapper._conv_roots) <= in_flight
