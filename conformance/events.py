"""Engine side of the KV-event check: the vLLM CPU engine publishing KV events over ZMQ while it serves
the workload one request at a time (run in the conformance venv, with PYTHONHASHSEED set).

`prefixscan record-events` (the project's side, conformance/run.py) subscribes before the first request:
the engine waits for the recorder's ready file, serves, writes what it served, waits a moment so the last
batches leave, and exits. The pool is bounded so that evictions (BlockRemoved) happen too.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from conformance.engine import digest, read_workload, render


def make_llm(model_dir: str, pool: int, max_model_len: int, port: int):
    from vllm import LLM
    from vllm.config import KVEventsConfig

    events = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://*:{port}",
                            replay_endpoint=f"tcp://*:{port + 1}")
    return LLM(model=model_dir, enable_prefix_caching=True, block_size=32, gpu_memory_utilization=0.3,
               max_model_len=max_model_len, max_num_seqs=4, seed=0, dtype="float32", enforce_eager=True,
               num_gpu_blocks_override=pool, kv_events_config=events)


def serve(llm: Any, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=1, temperature=0.0)
    out = []
    for rec in recs:
        ids = render(llm, rec)
        prompt: dict[str, Any] = {"prompt_token_ids": ids}
        if rec.get("cache_salt"):
            prompt["cache_salt"] = rec["cache_salt"]
        (res,) = llm.generate(prompt, sp, use_tqdm=False)
        out.append({"request_id": rec["request_id"], "prompt_tokens": len(ids), "digest": digest(ids),
                    "cached_tokens": int(res.num_cached_tokens or 0)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("workload")
    ap.add_argument("out")
    ap.add_argument("--pool", type=int, required=True)
    ap.add_argument("--port", type=int, default=45657)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--ready", required=True, help="file the recorder creates once it is subscribed")
    a = ap.parse_args()
    recs = read_workload(a.workload)
    llm = make_llm(a.model_dir, a.pool, a.max_model_len, a.port)
    deadline = time.time() + 120
    while not Path(a.ready).exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # a PUB socket drops what it sends before the subscription has reached it
    rows = serve(llm, recs)
    Path(a.out).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    time.sleep(3.0)  # let the publisher thread send the last batches
    print(f"events: served {len(rows)} requests with KV events on port {a.port}", flush=True)


if __name__ == "__main__":
    main()
