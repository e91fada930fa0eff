"""The physical floor of analysing a chat log on this machine: read the file, JSON-parse every record, and
tokenise only the prompt text that is not an ideal-cache hit, on all cores.

    .venv/bin/python bench/floor.py LOG.jsonl TOKENIZER SUFFIX.npy IDS.json [--workers N]

TOKENIZER is `tiktoken:ENCODING` or a local HF tokenizer directory. SUFFIX.npy holds, per request in file
order, how many characters of the rendered prompt lie after its ideal-cache hit (bench/naive_tokenize.py
--suffix writes it, with IDS.json the request ids). Each worker process (one per core by default, forked,
tokenizer loaded before the clock starts) reads its byte range of the file, parses each line with orjson,
takes that many characters from the end of the request's message texts and tokenises them with the bare
tokenizer (tiktoken's encode_ordinary; the HF fast tokenizer's Rust encode). No rendering, hashing, reuse
or output: anything analyze does beyond this is overhead over the floor. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from typing import Any

import numpy as np
import orjson

_STATE: dict[str, Any] = {}


def _load_encoder(spec: str) -> Any:
    if spec.startswith("tiktoken:"):
        import tiktoken

        enc = tiktoken.get_encoding(spec.split(":", 1)[1])
        return enc.encode_ordinary
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(spec, local_files_only=True).backend_tokenizer
    return lambda text: backend.encode(text, add_special_tokens=False).ids


def _init(spec: str, barrier: Any) -> None:
    _STATE["encode"] = _load_encoder(spec)
    barrier.wait()  # the clock starts when every worker has its tokenizer


def _tail(o: dict[str, Any], chars: int) -> str:
    """The last `chars` characters of the request's message texts (the uncached tail, up to markup)."""
    parts: list[str] = []
    size = 0
    for m in reversed(o.get("messages") or []):
        c = m.get("content")
        if isinstance(c, str):
            parts.append(c)
            size += len(c)
            if size >= chars:
                break
    text = "".join(reversed(parts))
    return text[len(text) - chars:] if chars < len(text) else text


def _work(job: tuple[str, int, int]) -> tuple[int, int, int]:
    path, start, end = job
    encode, suffix = _STATE["encode"], _STATE["suffix"]
    n = tokens = chars = 0
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    for line in data.splitlines():
        if not line:
            continue
        o = orjson.loads(line)
        want = suffix.get(o["request_id"], 0)
        if want:
            text = _tail(o, want)
            tokens += len(encode(text))
            chars += len(text)
        n += 1
    return n, tokens, chars


def _jobs(path: str, pieces: int) -> list[tuple[str, int, int]]:
    """Byte ranges that start and end at line boundaries."""
    size = os.path.getsize(path)
    cuts = [0]
    with open(path, "rb") as f:
        for i in range(1, pieces):
            f.seek(size * i // pieces)
            f.readline()
            cuts.append(max(cuts[-1], f.tell()))
    cuts.append(size)
    return [(path, a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("tokenizer")
    ap.add_argument("suffix")
    ap.add_argument("ids")
    ap.add_argument("--workers", type=int, default=0, help="processes (default: one per core)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    ids = json.loads(open(args.ids).read())
    _STATE["suffix"] = dict(zip(ids, np.load(args.suffix).tolist(), strict=True))
    workers = args.workers or len(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")  # the suffix table is inherited, not pickled
    barrier = ctx.Barrier(workers + 1)
    with ctx.Pool(workers, initializer=_init, initargs=(args.tokenizer, barrier)) as pool:
        barrier.wait()
        t0 = time.perf_counter()
        parts = pool.map(_work, _jobs(args.log, workers * 8), chunksize=1)
        dt = time.perf_counter() - t0
    print(json.dumps({"requests": sum(p[0] for p in parts), "tokens_tokenised": sum(p[1] for p in parts),
                      "chars_tokenised": sum(p[2] for p in parts), "workers": workers, "seconds": dt,
                      "wall_with_startup_s": time.perf_counter() - t_start}))


if __name__ == "__main__":
    main()
