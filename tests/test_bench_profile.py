"""The bench scripts behind the results' tables: py-spy samples by stage (bench/studies/profile_stages.py) and the
encode stage under the garbage collector's settings (bench/studies/encode_gc.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_samples_go_to_the_first_matching_stage(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(
        'process 1:"prefixscan";thread (1): MainThread;main (a.py:1);SegmentEncoder.plan (b.py:2) 30\n'
        'process 1:"prefixscan";thread (2): w;_worker (t.py:3);_WorkItem.run (concurrent/futures/thread.py:58) 20\n'
        'process 2:"w";thread (3): MainThread;_serve (w.py:1);Encoding.encode_ordinary (tiktoken/core.py:76) 40\n'
        'process 1:"prefixscan";thread (1): MainThread;_find_and_load (<frozen>:1) 10\n'
        "not a sample line\n"
        'process 1:"prefixscan";thread (1): MainThread;mystery (m.py:9) 100\n', encoding="utf-8")
    out = subprocess.run([sys.executable, str(ROOT / "bench/studies/profile_stages.py"), str(raw), "--rate", "10"],
                         check=True, capture_output=True, text=True).stdout
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in out.splitlines()[3:]}
    assert out.splitlines()[2].startswith("| all (20.00 s of samples)")
    assert rows == {"other": "10.00", "tiktoken itself": "4.00", "segment plan + assemble": "3.00",
                    "capacity curve": "2.00", "imports and start-up": "1.00"}


def test_encode_gc_bench_runs_and_the_settings_agree() -> None:
    """bench/studies/encode_gc.py on the sample chat log: every collector setting gives the same block hashes."""
    out = subprocess.run([sys.executable, str(ROOT / "bench/studies/encode_gc.py"),
                          str(ROOT / "sample_logs/chat.jsonl"),
                          "--limit", "60", "--repeats", "1"], check=True, capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["records"] == 60 and got["same_hashes"] is True
    assert set(got["cpu_s_median"]) == {"default", "fewer", "off"}
