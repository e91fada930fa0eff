"""Scale: the findings stage must not add more than the analysis itself (bench/studies/bench_findings.py runs 100k)."""

from __future__ import annotations

import time

import prefixscan
from prefixscan.synth import REGISTRY, SynthConfig, write
from prefixscan.synth.drift import DRIFT_KINDS


def test_findings_cost_at_most_the_analysis(tmp_path, capsys) -> None:
    log = tmp_path / "log.jsonl"
    write(SynthConfig(requests=4000, seed=5, tenants=8, prompt_tokens=600, breakers=tuple(REGISTRY),
                      breaker_rate=0.3, drift=DRIFT_KINDS, drift_rate=0.2), str(log))
    prefixscan.analyze(str(log), findings=False)  # warm caches (tokenizer, numba) before timing
    t0 = time.perf_counter()
    prefixscan.analyze(str(log), findings=False)
    plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = prefixscan.analyze(str(log))
    with_findings = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n4,000 requests: analysis {plain:.2f}s, with findings {with_findings:.2f}s "
              f"(+{with_findings - plain:.2f}s; findings stage {full.summary['timings']['findings_s']:.2f}s)")
    assert full.findings.findings
    assert with_findings - plain <= plain + 1.0  # shared CI machines are noisy: one second of slack
