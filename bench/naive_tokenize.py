"""Row 1's naive baseline: render and tokenise every prompt in full, hash its blocks, ideal-cache hits.

    .venv/bin/python bench/naive_tokenize.py LOG.jsonl TOKENIZER_DIR OUT.npy [--limit N] [--block-size 16]

For each request, in file order: `apply_chat_template(messages, tools=..., add_generation_prompt=True,
tokenize=True)` with the same local tokenizer prefixscan uses, the chained xxh3-64 of every full 16-token
block by `prefixscan.hashing.block_hashes` itself, from the same namespace root (model, tokenizer id,
template version), and the
ideal-cache hit = longest run of leading blocks already seen, in tokens by vLLM's rule
min(k, floor((n-1)/B)) * B. Writes request_id -> cached tokens and prints a JSON line with counts and
seconds. This is what a straightforward script does; it repeats all the work prefixscan memoises.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import orjson
import xxhash

from prefixscan.hashing import block_hashes, namespace_hash


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    tok_id = f"hf:{os.path.basename(os.path.normpath(args.tokenizer))}:{len(tok)}"
    template = f"hf-{xxhash.xxh3_64_hexdigest(str(tok.chat_template).encode())}"
    roots: dict[tuple, int] = {}
    seen: set[int] = set()
    bs = args.block_size
    ids_out: list[str] = []
    cached_out: list[int] = []
    n_tokens = 0
    t_load = time.perf_counter() - t0
    with open(args.log, "rb") as f:
        for i, line in enumerate(f):
            if args.limit and i >= args.limit:
                break
            o = orjson.loads(line)
            key = (o.get("model"), o.get("adapter") or o.get("lora_name"), o.get("cache_salt"))
            root = roots.get(key)
            if root is None:
                root = roots[key] = namespace_hash(key[0], tok_id, key[1], template, key[2])
            ids = tok.apply_chat_template(o["messages"], tools=o.get("tools"), add_generation_prompt=True,
                                          tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            n = len(ids)
            n_tokens += n
            k, matching = 0, True
            for h in block_hashes(np.asarray(ids, dtype=np.uint32), bs, root).tolist():
                if matching and h in seen:
                    k += 1
                else:
                    matching = False
                    seen.add(h)
            ids_out.append(o["request_id"])
            cached_out.append(min(k, (n - 1) // bs) * bs if n else 0)
    dt = time.perf_counter() - t0
    np.save(args.out, np.array(cached_out, dtype=np.int64))
    with open(args.out + ".ids.json", "w") as f:
        json.dump(ids_out, f)
    print(json.dumps({"requests": len(cached_out), "tokens": n_tokens, "seconds": dt, "load_s": t_load,
                      "cached_tokens": int(sum(cached_out))}))


if __name__ == "__main__":
    main()
