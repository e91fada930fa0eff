"""Findings at scale: the cache-breaker stage must not add more than the analysis itself (issue 3).

Generates (once, cached under bench/out/) a synthetic log with every breaker kind and drift kind, then runs
`analyze` with and without findings in the same process, back to back, and prints both times and the
findings' precision/recall against the synth truth.

    .venv/bin/python bench/studies/bench_findings.py [--requests 100000] [--prompt-tokens 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import prefixscan  # noqa: E402
from prefixscan.synth import REGISTRY, SynthConfig, write  # noqa: E402
from prefixscan.synth.drift import DRIFT_KINDS  # noqa: E402
from tests.test_findings_synth import evaluate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"findings_{args.requests}_{args.prompt_tokens}_{args.seed}.jsonl"
    cfg = SynthConfig(requests=args.requests, seed=args.seed, tenants=8, prompt_tokens=args.prompt_tokens,
                      breakers=tuple(REGISTRY), breaker_rate=0.3, drift=DRIFT_KINDS, drift_rate=0.2)
    if not log.exists():
        write(cfg, str(log))
    t0 = time.perf_counter()
    plain = prefixscan.analyze(str(log), findings=False)
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = prefixscan.analyze(str(log))
    t_full = time.perf_counter() - t0
    truth = {t["request_id"]: t for t in map(orjson.loads, open(f"{log}.truth.jsonl", "rb"))}
    score = evaluate([f.to_row() for f in full.findings.findings], truth)
    tp = sum(v[0] for v in score["per_kind"].values())
    fp = sum(v[1] for v in score["per_kind"].values())
    fn = sum(v[2] for v in score["per_kind"].values())
    print(json.dumps({
        "requests": args.requests, "analysis_without_findings_s": round(t_plain, 1),
        "analysis_with_findings_s": round(t_full, 1), "added_s": round(t_full - t_plain, 1),
        "added_over_analysis": round((t_full - t_plain) / t_plain, 3), "findings_stage_s": full.summary["timings"],
        "findings": len(full.findings.findings), "counterfactual": full.summary["counterfactual"],
        "precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
        "recall": round(tp / (tp + fn), 4) if tp + fn else 1.0,
        "hit_rate_without": plain.summary["hit_rate"]["token_weighted"],
    }, indent=2))


if __name__ == "__main__":
    main()
