"""Row 3: `prefixscan analyze` vs `aiperf analyze-trace` (PyPI `aiperf`) on a Mooncake-format hashed trace.

Hit rate compared: AIPerf's headline "theoretical hit rate", the mean over requests of
(leading hash ids already seen / hash ids of the request), infinite cache. prefixscan reports the same
definition; it is recomputed here from `requests.parquet` (cached_blocks / listed blocks) as a check.
"""

from __future__ import annotations

import json
from pathlib import Path

import inputs
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from common import OUT, PEERS_BIN, RowResult, analyze_cmd, fmt_s, human_bytes, measure_rss, median, rel, remember

TRACE_N = {"small": 100_000, "full": 1_000_000}


def trace_run_dir(scale: str) -> Path:
    return OUT / f"run-trace-{scale}"


def ps_mean_per_request(run_dir: Path) -> tuple[float, float]:
    t = pq.read_table(run_dir / "requests.parquet", columns=["cached_blocks", "block_hashes"])
    n_blocks = pc.list_value_length(t["block_hashes"]).to_numpy(zero_copy_only=False).astype(np.float64)
    cached = t["cached_blocks"].to_numpy(zero_copy_only=False).astype(np.float64)
    frac = np.divide(cached, n_blocks, out=np.zeros_like(cached), where=n_blocks > 0)
    summ = pq.read_table(run_dir / "summaries.parquet").to_pylist()
    allrow = next(r for r in summ if r["dimension"] == "all")
    return float(frac.mean()), float(allrow["request_mean"])


def run_row(scale: str, repeats: int, lg: Path) -> RowResult:
    res = RowResult(3, "Mooncake-format hashed trace (synth, 512-token blocks), `analyze`",
                    "`aiperf analyze-trace` (PyPI `aiperf`)", ">= 5x faster, same mean-per-request hit rate")
    n = TRACE_N[scale]
    trace = inputs.trace(n, lg)
    run_dir = trace_run_dir(scale)
    pcmd = analyze_cmd([trace], run_dir)
    res.cmd(pcmd)
    ps_runs = [measure_rss(pcmd, log=lg) for _ in range(repeats)]
    remember(pcmd, ps_runs[-1])
    ps_mean, ps_summary_mean = ps_mean_per_request(run_dir)
    t_ps = median([r.seconds for r in ps_runs])
    res.details += [
        f"input: `{rel(trace)}` ({trace.stat().st_size / 1e6:,.0f} MB, {n:,} requests), made by "
        f"`prefixscan synth -f mooncake -s all --prompt-tokens 8000 --seed {inputs.SEED}`",
        f"prefixscan: median {fmt_s(t_ps)} of {[round(r.seconds, 2) for r in ps_runs]} "
        f"({n / t_ps:,.0f} requests/s), peak RSS {human_bytes(max(r.maxrss_kib for r in ps_runs) * 1024)}; "
        f"mean per-request hit (block fractions) {ps_mean:.6f}; summary `request_mean` (token fractions) "
        f"{ps_summary_mean:.6f}",
    ]
    ap = PEERS_BIN / "aiperf"
    if not ap.exists():
        res.verdict = "not run: aiperf not installed in bench/out/peers-venv"
        return res
    report = OUT / f"aiperf-{scale}.json"
    acmd = [str(ap), "analyze-trace", rel(trace), "--block-size", "512", "--output-file", rel(report)]
    res.cmd(acmd)
    ap_runs = []
    for _ in range(repeats if scale == "small" else 1):
        r = measure_rss(acmd, check=False, log=lg)
        ap_runs.append(r)
        if r.rc != 0:
            break
    if ap_runs[-1].rc != 0 or not report.exists():
        res.verdict = "peer failed"
        res.details.append(f"aiperf exited {ap_runs[-1].rc}: `{ap_runs[-1].stderr.strip()[-400:]}`")
        return res
    stats = json.loads(report.read_text())
    ap_hit = float(stats["cache_hit_rate"])
    t_ap = median([r.seconds for r in ap_runs])
    ratio = t_ap / t_ps
    diff = abs(ap_hit - ps_mean)
    res.measured = (f"{n:,} req: prefixscan {fmt_s(t_ps)}, aiperf {fmt_s(t_ap)}; mean per-request hit "
                    f"{ps_mean:.6f} vs {ap_hit:.6f}")
    res.ratio = f"{ratio:.1f}x"
    gaps = [f"speed {ratio:.1f}x < 5x" if ratio < 5 else "", f"hit differs by {diff:.2e}" if diff > 1e-9 else ""]
    res.verdict = "met" if not any(gaps) else "gap: " + ", ".join(g for g in gaps if g)
    res.details += [
        f"aiperf: median {fmt_s(t_ap)} of {[round(r.seconds, 2) for r in ap_runs]}, peak RSS "
        f"{human_bytes(max(r.maxrss_kib for r in ap_runs) * 1024)}; `cache_hit_rate` {ap_hit:.6f}",
        f"difference in mean per-request hit: {diff:.2e}",
        "prefixscan's time is its whole `analyze` (tables, attribution, capacity curve with OPT, report "
        "tables); aiperf's is its whole `analyze-trace`",
    ]
    res.data = {"ps_s": [r.seconds for r in ps_runs], "aiperf_s": [r.seconds for r in ap_runs],
                "ps_mean_per_request": ps_mean, "aiperf_hit": ap_hit, "requests": n,
                "ps_maxrss_kib": max(r.maxrss_kib for r in ps_runs),
                "aiperf_maxrss_kib": max(r.maxrss_kib for r in ap_runs)}
    return res
