"""Drive SGLang's own RadixCache (sglang.srt.mem_cache.radix_cache) on the CPU with the engine's prompt ids.

No SGLang server: it needs CUDA kernels. The radix tree itself is plain Python and torch; a request's
lookup is what SGLang's scheduler does (`Req.init_next_round_input`): match the prompt capped at n-1
tokens (`_compute_max_prefix_len`), in the namespace of its cache_salt, page-aligned; when it finishes
(max_tokens=1: only the prompt's KV was computed) its prompt is inserted. No pool, so no eviction: the
comparison is with prefixscan's unbounded figures (`--granularity token` for page size 1, block B for
page size B).

The prompt ids are the engine's: rendered with the family's tokenizer and chat template as vLLM does
(template text, then encode without special tokens) and checked against the digest vLLM recorded.

Runs in the conformance venv with the sglang wheel unpacked on PYTHONPATH (conformance/sglang_setup.py).
Usage: python -m conformance.sglang_driver FAMILY_DIR WORKLOAD.jsonl ENGINE_RESULT.jsonl OUT_DIR
"""

from __future__ import annotations

import argparse
import json
from array import array
from pathlib import Path
from typing import Any

from conformance import torchvision_stub
from conformance.engine import digest, read_workload, write

PAGE_SIZES = (1, 16, 32)


def prompts(model_dir: str, recs: list[dict[str, Any]], engine_rows: list[dict[str, Any]]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for rec, row in zip(recs, engine_rows, strict=True):
        text = tok.apply_chat_template(rec["messages"], tools=rec.get("tools"), add_generation_prompt=True,
                                       tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        if digest(ids) != row["digest"]:
            raise SystemExit(f"{rec['request_id']}: these ids are not the engine's; no SGLang comparison")
        out.append(ids)
    return out


def run(recs: list[dict[str, Any]], ids: list[list[int]], page_size: int) -> list[dict[str, Any]]:
    """Each request: match (capped at n-1, page-aligned, salted), then insert its prompt."""
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    cache = RadixCache(CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None,
                                       page_size=page_size))
    out, slot = [], 0
    for rec, p in zip(recs, ids, strict=True):
        salt = rec.get("cache_salt") or None
        toks = array("q", p)
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(toks, cache_salt=salt, limit=max(len(p) - 1, 0))))
        value = torch.arange(slot, slot + len(p), dtype=torch.int64)
        slot += len(p)
        cache.insert(InsertParams(key=RadixKey(toks, cache_salt=salt), value=value))
        out.append({"request_id": rec["request_id"], "prompt_tokens": len(p), "digest": digest(p),
                    "cached_tokens": int(m.device_prefix_len), "block_hashes": []})
    return out


def main() -> None:
    torchvision_stub.install()
    import sglang

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("workload")
    ap.add_argument("engine_result")
    ap.add_argument("out")
    a = ap.parse_args()
    recs = read_workload(a.workload)
    rows = [json.loads(x) for x in Path(a.engine_result).read_text(encoding="utf-8").splitlines()[1:]]
    ids = prompts(a.model_dir, recs, rows)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    for ps in PAGE_SIZES:
        res = run(recs, ids, ps)
        head = {"kind": "sglang", "block_size": ps, "pool_blocks": 0, "bounded": False, "hash_algo": None,
                "pythonhashseed": None, "sglang": sglang.__version__, "requests": len(recs)}
        write(Path(a.out) / f"sglang-b{ps}-p0.jsonl", head, res)
        print(f"sglang radix cache page {ps}: {len(res)} requests", flush=True)


if __name__ == "__main__":
    main()
