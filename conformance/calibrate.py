"""`make calibrate`: fit the simulator's replica model to one real vLLM engine, then check it under load.

Per workload (the conformance bpe workload and a synthetic chat log made by `prefixscan synth`, both
rendered with the bpe family's tokenizer and run on its tiny random-weight Llama):
1. the engine side (conformance.calibrate_engine, vLLM venv) runs one engine with a bounded pool: a solo
   pass (one request at a time) and two load passes (the log's arrival times, rate-scaled);
2. the prefill-time coefficients of prefixscan.sim.timing (ms = a + b*new + c*cached + d*new*cached +
   e*new^2) are fitted to the solo pass by non-negative least squares, and the time per output token;
   the fit is saved as a named hardware profile (prefixscan/sim/profiles/, `simulate --timing-profile`);
3. the same log is analysed (`hf:` the same tokenizer, block 32) and replayed by a one-replica
   `prefixscan simulate` with the engine's pool, batch limits, rate scale and the fitted profile; cached
   tokens are compared per request with each load pass, TTFT and queue-time percentiles in total;
4. the table goes into docs/simulator.md and the per-request result into tests/data/calibration.json,
   which tests/test_calibration.py checks on every `make test` without vLLM.

Usage: python -m conformance.calibrate [--vllm-python conformance/.venv/bin/python] [--out DIR]
       [--workloads conformance,synth] [--skip-engine] [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOKDIR = ROOT / "conformance" / "fixtures" / "bpe" / "tokenizer"
PROFILE = ROOT / "prefixscan" / "sim" / "profiles" / "vllm-cpu-tiny-llama.json"
FIXTURE = ROOT / "tests" / "data" / "calibration.json"
# one engine configuration for every pass; the simulator replays with the same limits
ENGINE = {"block_size": 32, "max_num_seqs": 8, "max_num_batched_tokens": 16384, "max_model_len": 4096}
WORKLOADS = {
    # name: (rate scale, pool blocks, output-token cap)
    "conformance": (60.0, 140, 1),
    "synth": (2.5, 160, 4),
}
SYNTH_MAX = 2000  # longest synth prompt kept (tokens): one prefill fits the step budget


def sh(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, **(env or {})})


def write_jsonl(path: Path, recs: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")


def make_workload(name: str, path: Path) -> None:
    """The conformance generator's 250 requests (10 s apart), or a synth chat log (bursty arrivals) without
    its prompts longer than SYNTH_MAX tokens."""
    if name == "conformance":
        from conformance.workload import generate

        write_jsonl(path, generate(str(TOKDIR)))
        return
    from conformance.workload import Padder
    from prefixscan.synth import SynthConfig, generate

    cfg = SynthConfig(requests=300, seed=5, tenants=2, prompt_tokens=150, rps=2.0,
                      scenarios=(("chat", 3.0), ("shared_prompt", 1.0), ("doc_qa", 2.0), ("rag", 2.0)))
    cap = WORKLOADS[name][2]
    tok = Padder(str(TOKDIR))  # the family's tokenizer and chat template: keep prompts up to SYNTH_MAX tokens
    keep = [r for r in generate(cfg) if tok.length(r["messages"], r.get("tools")) <= SYNTH_MAX]
    write_jsonl(path, [r | {"output_tokens": min(int(r.get("output_tokens") or 1), cap), "max_tokens": cap}
                       for r in keep])


def read_passes(path: Path) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """(pass headers, rows per pass) from the engine side's JSONL."""
    heads: list[dict[str, Any]] = []
    rows: list[list[dict[str, Any]]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        if "header" in d:
            heads.append(d["header"])
            rows.append([])
        else:
            rows[-1].append(d)
    return heads, rows


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (drop the most negative term and refit; few terms)."""
    keep = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        neg = [k for k in keep if coef[k] < 0]
        if not neg:
            return coef
        keep.remove(min(neg, key=lambda k: coef[k]))


def design(new: np.ndarray, cached: np.ndarray) -> np.ndarray:
    """Columns of timing.PrefillModel: 1, new, cached, new*cached, new^2."""
    return np.column_stack([np.ones_like(new), new, cached, new * cached, new * new])


def fit_prefill(solo: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Prefill ms from (new, cached) over every solo pass; outliers beyond 4 MADs (load spikes) refit."""
    rows = [r for p in solo for r in p]
    cached = np.array([r["cached_tokens"] for r in rows], dtype=float)
    new = np.array([r["prompt_tokens"] for r in rows], dtype=float) - cached
    ms = np.array([(r["first_token_s"] - r["scheduled_s"]) * 1000.0 for r in rows])
    x = design(new, cached)
    coef = nnls(x, ms)
    res = ms - x @ coef
    mad = float(np.median(np.abs(res - np.median(res)))) or 1e-9
    ok = np.abs(res) <= 4 * 1.4826 * mad
    coef = nnls(x[ok], ms[ok])
    res = ms[ok] - x[ok] @ coef
    r2 = 1 - float(res @ res) / float(((ms[ok] - ms[ok].mean()) ** 2).sum())
    return {"coef": [float(c) for c in coef], "requests": len(rows), "outliers_dropped": int((~ok).sum()),
            "rmse_ms": float(np.sqrt(np.mean(res**2))), "r2": r2, "median_ms": float(np.median(ms))}


def fit_tpot(solo: list[list[dict[str, Any]]]) -> float | None:
    """Median seconds per output token after the first, alone on the engine (None: no decodes)."""
    per = [(r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
           for p in solo for r in p if r["output_tokens"] > 1 and "last_token_s" in r]
    return float(np.median(per)) if per else None


def run_engine(a: argparse.Namespace, name: str, wl: Path, res: Path) -> None:
    scale, pool, _ = WORKLOADS[name]
    sh([a.vllm_python, "-m", "conformance.calibrate_engine", str(a.models / "bpe"), str(wl), str(res),
        "--pool", str(pool), "--rate-scale", str(scale), "--passes", a.passes,
        *[f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]], env={"PYTHONHASHSEED": "0"})


def ensure_model(a: argparse.Namespace) -> None:
    if not (a.models / "bpe" / "model.safetensors").exists():
        sh([a.vllm_python, "-m", "conformance.families", str(a.models), "--families", "bpe"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default=str(ROOT / "conformance/.venv/bin/python"))
    ap.add_argument("--out", default=str(ROOT / "conformance/out/calibration"))
    ap.add_argument("--models", default=None, help="model directories (default: OUT/models; built if missing)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--passes", default="solo,load,load", help="engine passes per workload")
    ap.add_argument("--skip-engine", action="store_true", help="reuse the engine results already in --out")
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    a.models = Path(a.models) if a.models else out / "models"
    names = a.workloads.split(",")
    if not a.skip_engine:
        ensure_model(a)
    for name in names:
        wl, res = out / name / "workload.jsonl", out / name / "engine.jsonl"
        if not a.skip_engine:
            make_workload(name, wl)
            run_engine(a, name, wl, res)
    from conformance import calibrate_report as rep

    passes = {n: read_passes(out / n / "engine.jsonl") for n in names}
    solo = [rows for n in names for h, rows in zip(*passes[n], strict=True) if h["kind"] == "solo"]
    fit, tpot = fit_prefill(solo), fit_tpot(solo)
    heads = [h for n in names for h in passes[n][0]]
    profile = rep.write_profile(PROFILE, fit, tpot, heads)
    results = {n: rep.compare(out / n / "workload.jsonl", TOKDIR, passes[n], profile, WORKLOADS[n], ENGINE)
               for n in names}
    table = rep.table(results, fit, profile)
    print(table)
    rep.write_fixture(FIXTURE, results, profile)
    if not a.no_docs:
        rep.write_docs(ROOT / "docs" / "simulator.md", table)
    sys.exit(0)


if __name__ == "__main__":
    main()
