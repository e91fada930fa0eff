"""Row 9: the encode stage on 1 core vs 2 cores (`analyze --workers 0` held to one core vs the default).

The one-core run is `--workers 0` with the process (and its tokenizer threads) held to core 0 by CPU affinity
(`ONE_CORE`), so it is a one-core figure; `--workers 0` free to use both cores (its tokenizer threads drop
the GIL) is measured beside it, as before, for comparison.

`analyze` picks its encode workers itself (prefixscan/encode/encoder.py `auto_workers`: one per spare
core, at most one per 64 MiB of input); `--workers N` overrides it (N processes beside the main
one, which encodes a share itself). The encode stage is the manifest's `ingest_s` (read + render + tokenise
+ hash); the rest of analyze (reuse, capacity curve, findings, writing) runs in the main process either
way and is reported beside it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import realistic as rz
from common import OUT, RowResult, analyze_cmd, fmt_s, measure_rss, median, rel

TARGET = 1.8
# Runs the command held to CPU 0 (what `taskset -c 0` does, without needing util-linux): affinity is
# inherited by the threads it starts, so tiktoken's threads share the one core.
ONE_CORE = [sys.executable, "-c", "import os, sys; os.sched_setaffinity(0, {0}); os.execvp(sys.argv[1], sys.argv[1:])"]
# (label, command prefix, extra analyze options): the one-core run, --workers 0 on both cores, the default
RUNS = (("1 core", ONE_CORE, ("--workers", "0")), ("--workers 0", [], ("--workers", "0")),
        ("2 cores", [], ("--workers", "1")))


def run_row(scale: str, repeats: int, lg: Path, profile: bool = False) -> RowResult:
    res = RowResult(9, "encode stage of `analyze` on the realistic chat log, 1 vs 2 cores, default tokenizer",
                    "the same command with `--workers 0`, held to one core",
                    f">= {TARGET}x on the encode stage with 2 cores")
    load_before = rz.loadavg()
    log = rz.real_text_log(rz.REAL_N[scale], lg)
    out: dict[str, dict] = {}
    for i, (label, prefix, extra) in enumerate(RUNS):
        run_dir = OUT / f"run-scaling-{i}"
        cmd = [*prefix, *analyze_cmd([log], run_dir, *extra)]
        res.cmd(cmd)
        runs = [measure_rss(cmd, log=lg) for _ in range(max(1, repeats if scale == "small" else 1))]
        timings = rz.manifest(run_dir).get("timings") or {}
        out[label] = {"wall_s": median([r.seconds for r in runs]), "runs": [r.seconds for r in runs],
                      "cpu_s": [r.cpu_s for r in runs], "rss_kib": runs[-1].maxrss_kib,
                      "ingest_s": timings.get("ingest_s"), "total_s": timings.get("total_s"),
                      "stats": rz.tokenizer_stats(run_dir)}
        if profile and label == "2 cores":  # the 2-core run: where the encode stage waits
            out[label]["profile"] = rz.profile(f"`analyze --workers 1` on `{rel(log)}`", cmd,
                                               OUT / "profile-scaling-w1.txt", lg)
    one, free, two = (out[label] for label, _, _ in RUNS)
    enc = one["ingest_s"] / two["ingest_s"]
    wall = one["wall_s"] / two["wall_s"]
    res.measured = (f"encode stage {fmt_s(one['ingest_s'])} on 1 core, {fmt_s(two['ingest_s'])} on 2; "
                    f"whole analyze {fmt_s(one['wall_s'])} vs {fmt_s(two['wall_s'])}; `--workers 0` on both cores: "
                    f"encode stage {fmt_s(free['ingest_s'])}")
    res.ratio = (f"{enc:.2f}x encode stage; {wall:.2f}x whole analyze; `--workers 0` on 2 cores vs 1 worker: "
                 f"{free['ingest_s'] / two['ingest_s']:.2f}x")
    res.verdict = "met" if enc >= TARGET else f"gap: {enc:.2f}x < {TARGET}x"
    for label, _, extra in RUNS:
        st, o = out[label]["stats"], out[label]
        res.details.append(
            f"{label} (`{' '.join(extra)}`): wall {fmt_s(o['wall_s'])} (runs {[round(x, 1) for x in o['runs']]}, CPU "
            f"{[round(x, 1) for x in o['cpu_s']]} s, peak RSS {o['rss_kib'] / 1024:,.0f} MiB), "
            f"ingest_s {o['ingest_s']}, total_s {o['total_s']}; "
            f"encode workers {st.get('encode_workers', 0)}, "
            f"encoded in main {st.get('encoded_in_main', 'all')}, main waited {st.get('wait_s_main', 0)} s, workers "
            f"busy {st.get('busy_s_workers', 0)} s")
    res.details += model(two["stats"])
    res.details += [
        f"input: `{rel(log)}` (`{rz.real_cmd(rz.REAL_N[scale])}`; {rz.real_corpus_note(log)})",
        "the 1-core run is `--workers 0` held to CPU 0 by affinity (its tokenizer threads too); `--workers 0` "
        "free on both cores is not a one-core figure (tiktoken's threads drop the GIL); the model below is in "
        "CPU seconds and does not depend on the load",
        "without `--workers` analyze chooses 1 worker here (prefixscan/encode/encoder.py `auto_workers`: "
        "one per spare core, at most one per 64 MiB of input, no fixed cap); on a 64-core box the encode "
        "stage is then bounded by the single ingesting process, which reads, parses, routes records, runs the "
        "detector and reuse alone",
        f"load average before the row: {load_before}; after: {rz.loadavg()}. With the load above 2 the second "
        "core is not free, so this ratio is only meaningful on a quiet machine",
    ]
    res.details += two.get("profile", [])
    res.data = {label: {k: v for k, v in o.items() if k != "profile"} for label, o in out.items()}
    return res


def model(st: dict) -> list[str]:
    """The encode stage on more cores, from the CPU seconds the pool measured (`EncodePool.counters`): the main
    process's own work (reading, columns, detector, routing) is serial, the encoding spreads over the
    processes, so N workers on N+1 cores take at least max(own, (own + encode) / (N + 1)): a bound, since
    waits, the GIL shared with the main process's other threads and the capacity pass beside the ingest
    are not in it."""
    own, enc = st.get("cpu_s_main_own"), (st.get("cpu_s_main_encode") or 0) + (st.get("cpu_s_workers_encode") or 0)
    if own is None or not enc:
        return ["scaling model: the run reported no pool counters (cpu_s_main_own)"]
    total = own + enc
    pred = {n: total / max(own, total / (n + 1)) for n in (1, 3, 7, 15)}
    return [f"scaling model (CPU seconds of the 2-core run: main's own work {own:.1f} s, encoding {enc:.1f} s in all "
            f"processes): upper bound of the encode-stage speed-up over the same work on one core (perfect overlap; "
            f"the measured ratio above shows how much of it two cores get) "
            + ", ".join(f"{n + 1} cores {x:.2f}x" for n, x in pred.items())
            + f"; the main process's own work bounds it at {total / own:.1f}x (reading and parsing stay in it)"]
