"""Make tests/data/vllm_engine_tokens.jsonl and vllm_engine_blocks.json with the real vLLM engine
(not part of `make test`; the venv as in make_vllm_hash_vectors.py):

    VENV/bin/python tests/data/make_vllm_engine_blocks.py MODEL_DIR tests/data

MODEL_DIR: any small model vLLM's CPU backend runs with a vocabulary of at least 600 tokens, e.g. a
random-weight 2-layer Llama saved with `save_pretrained` next to a tokenizer (docs/engines.md); only
token ids matter here. The log is 24 token-id requests (a shared 150-token head, tails of 0 to 97
tokens, next turns that resend a request and add 40 tokens, cache salts of three tenants). For each
algorithm the engine (block size 32, prefix caching, PYTHONHASHSEED=123, in-process engine core) runs the
requests one at a time; the file records each request's `num_cached_tokens` and every block hash the
block pool holds at the end, as the KV events' 64-bit integers.
"""

import json
import os
import random
import subprocess
import sys

ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
SEED = "123"


def make_log(path: str) -> None:
    rng = random.Random(7)
    head = [rng.randrange(5, 600) for _ in range(150)]
    recs: list[dict] = []
    for i in range(24):
        salt = ["", "tenant-a", "tenant-b"][i % 3]
        body = head + [rng.randrange(5, 600) for _ in range(rng.choice([0, 31, 32, 33, 64, 97]))]
        if i % 4 == 3:  # the next turn of the request before
            body = recs[i - 1]["prompt_token_ids"] + [rng.randrange(5, 600) for _ in range(40)]
            salt = recs[i - 1].get("cache_salt") or ""
        r = {"request_id": f"r{i}", "timestamp": 1700000000 + i, "prompt_token_ids": body}
        if salt:
            r["cache_salt"] = salt
        recs.append(r)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)


def run_engine(model: str, algo: str, log: str) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.v1.core.kv_cache_utils import get_block_hash

    llm = LLM(model=model, enable_prefix_caching=True, block_size=32, max_model_len=2048,
              kv_cache_memory_bytes=64 << 20, prefix_caching_hash_algo=algo, seed=0, enforce_eager=True)
    cached = []
    for line in open(log):
        r = json.loads(line)
        prompt = {"prompt_token_ids": r["prompt_token_ids"]}
        if r.get("cache_salt"):
            prompt["cache_salt"] = r["cache_salt"]
        out = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)[0]
        cached.append(out.num_cached_tokens)
    mgr = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager
    pool = getattr(mgr, "block_pool", None) or mgr.coordinator.block_pool
    hashes = sorted(int.from_bytes(get_block_hash(k), "big") & ((1 << 64) - 1)
                    for k in pool.cached_block_hash_to_block._cache)
    return {"algo": algo, "cached_tokens": cached, "block_hashes": hashes}


def main() -> None:
    if sys.argv[1] == "--one":
        print(json.dumps(run_engine(*sys.argv[2:5])))
        return
    model, out = sys.argv[1], sys.argv[2]
    log = os.path.join(out, "vllm_engine_tokens.jsonl")
    make_log(log)
    env = {**os.environ, "PYTHONHASHSEED": SEED, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    runs = []
    for algo in ALGOS:
        p = subprocess.run([sys.executable, __file__, "--one", model, algo, log], env=env, check=True,
                           capture_output=True, text=True)
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    import vllm

    doc = {"produced_by": "tests/data/make_vllm_engine_blocks.py", "vllm_version": vllm.__version__,
           "pythonhashseed": SEED, "block_size": 32, "runs": runs}
    with open(os.path.join(out, "vllm_engine_blocks.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
