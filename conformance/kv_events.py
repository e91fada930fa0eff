"""`make conformance`, KV events: `prefixscan record-events` against the real engine's ZMQ publisher.

The engine (conformance/events.py, in the vLLM venv) serves a family's workload with KV events on and a
bounded pool; `prefixscan record-events` records it from before the first request until the engine is done
(then it is interrupted, as a user would); `prefixscan analyze --hash vllm:sha256 --hash-seed 0
--kv-events` joins the recording with the run. Checked: no sequence gap, every full block prefixscan
predicts was stored by the engine, no block the engine stored is missing from prefixscan's prediction,
evictions were seen, and the engine's cached tokens equal prefixscan's pool model at that pool.

Usage: python -m conformance.kv_events --vllm-python conformance/.venv/bin/python --out conformance/out
       [--family bpe] [--pool 140]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PS = str(Path(sys.executable).with_name("prefixscan"))
PORT = 45657


def record_and_serve(a: argparse.Namespace, famdir: Path, model: Path) -> tuple[Path, Path, str]:
    events, served, ready = famdir / "kv_events.parquet", famdir / "kv_events_served.jsonl", famdir / ".ready"
    ready.unlink(missing_ok=True)
    rec = subprocess.Popen([PS, "record-events", f"tcp://127.0.0.1:{PORT}", "--replay",
                            f"tcp://127.0.0.1:{PORT + 1}", "-o", str(events), "--force"],
                           stdout=subprocess.PIPE, text=True, cwd=ROOT)
    time.sleep(2.0)  # subscribed (ZMQ connects as soon as the engine binds)
    ready.touch()
    try:
        subprocess.run([a.vllm_python, "-m", "conformance.events", str(model), str(famdir / "workload.jsonl"),
                        str(served), "--pool", str(a.pool), "--port", str(PORT), "--ready", str(ready),
                        "--max-model-len", str(a.max_model_len)], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
    finally:
        time.sleep(2.0)
        rec.send_signal(signal.SIGINT)
        line = rec.communicate(timeout=60)[0].strip()
    return events, served, line


def check(famdir: Path, model: Path, events: Path, served: Path, pool: int) -> dict[str, Any]:
    import prefixscan
    from prefixscan.evidence.attach import attach_evidence
    from prefixscan.reuse.pool import pool_hits

    run = famdir / "kv_events_run"
    res = prefixscan.analyze(str(famdir / "workload.jsonl"), output=str(run), force=True, tokenizer=f"hf:{model}",
                             block_size=32, findings=False, hash="vllm:sha256", hash_seed="0")
    ev = attach_evidence(str(run), kv_events=str(events)).kv_events
    req = res.tables["requests"]
    rows = [json.loads(x) for x in served.read_text().splitlines()]
    hashes = req["block_hashes"].to_pylist()
    off = np.concatenate([[0], np.cumsum([len(h) for h in hashes])]).astype(np.int64)
    flat = np.concatenate([np.asarray(h, np.uint64) for h in hashes])
    ours = pool_hits(off, flat, np.asarray(req["prompt_tokens"].to_pylist(), np.int64), 32, pool)
    j = ev.to_json()
    return {"requests": len(rows), "prompt_equal": sum(r["prompt_tokens"] == n for r, n in
                                                      zip(rows, req["prompt_tokens"].to_pylist(), strict=True)),
            "cached_equal": sum(r["cached_tokens"] == int(c) for r, c in zip(rows, ours, strict=True)), **j,
            "removed_hashes": _removed(events)}


def _removed(path: Path) -> int:
    """Block hashes the engine reported removed (evictions)."""
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["kind", "block_hashes"]).to_pylist()
    return sum(len(r["block_hashes"]) for r in t if r["kind"] == "BlockRemoved")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default=str(ROOT / "conformance/.venv/bin/python"))
    ap.add_argument("--out", default=str(ROOT / "conformance/out"))
    ap.add_argument("--family", default="bpe")
    ap.add_argument("--pool", type=int, default=140)
    ap.add_argument("--max-model-len", type=int, default=1792)
    a = ap.parse_args()
    famdir, model = Path(a.out) / a.family, Path(a.out) / "models" / a.family
    events, served, line = record_and_serve(a, famdir, model)
    print(line, flush=True)
    out = check(famdir, model, events, served, a.pool)
    print(json.dumps(out, indent=1), flush=True)
    ok = (out["gaps"] == 0 and out["stored_blocks"] == out["predicted_blocks"] and out["engine_only_blocks"] == 0
          and out["prompt_equal"] == out["requests"] == out["cached_equal"] and out["removed_hashes"] > 0)
    print("kv events: " + ("every check holds" if ok else "MISMATCH"), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
