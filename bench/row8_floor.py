"""Row 8: prefixscan against the physical floor of each realistic chat workload on this machine (the
real-text logs of bench/realistic.py).

The floor (bench/floor.py) is what no implementation can avoid: read the file, JSON-parse every record,
and tokenise only the prompt text that is not an ideal-cache hit, on all cores. The uncached tails come
from the naive loop's exact ideal-cache hits (bench/naive_tokenize.py --suffix). prefixscan's time is the
whole `analyze` process (start-up, hashing, reuse, capacity curve, findings and writing the run included)
and, beside it, its ingest stage alone (read + render + tokenise + hash), both as multiples of the floor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import inputs
import realistic as rz
from common import OUT, PY, ROOT, RowResult, analyze_cmd, fmt_s, measure_rss, median, rel

TARGET = 1.5


def floor(log: Path, spec: str, repeats: int, res: RowResult, lg: Path) -> dict[str, Any]:
    """The floor's median seconds on `log` (the naive loop's tails, run if no earlier row did)."""
    rz.naive_result(log, spec, lg)
    cached, suffix, _ = rz.naive_paths(log, spec)
    cmd = [PY, str(ROOT / "bench/floor.py"), rel(log), rz.naive_tok_arg(spec), rel(suffix), rel(cached) + ".ids.json"]
    res.cmd(cmd)
    measured = [measure_rss(cmd, log=lg) for _ in range(max(1, repeats))]
    runs = [json.loads(m.stdout.strip().splitlines()[-1]) for m in measured]
    out = runs[-1]
    out["cpu_s"], out["maxrss_kib"] = measured[-1].cpu_s, measured[-1].maxrss_kib
    out["seconds_all"] = [r["seconds"] for r in runs]
    out["seconds"] = median(out["seconds_all"])
    return out


def one(log: Path, spec: str, repeats: int, res: RowResult, lg: Path, profile: bool) -> dict[str, Any]:
    fl = floor(log, spec, repeats, res, lg)
    run_dir = OUT / f"run-floor-{log.stem}-{rz.tok_tag(spec)}"
    cmd = analyze_cmd([log], run_dir, *([] if spec == rz.DEFAULT_TOKENIZER else ["--tokenizer", spec]))
    res.cmd(cmd)
    ps = measure_rss(cmd, log=lg)  # right after the floor: the two are compared under the same load
    ingest = (rz.manifest(run_dir).get("timings") or {}).get("ingest_s")
    out = {"log": rel(log), "tokenizer": spec, "floor": fl, "ps_s": ps.seconds, "ingest_s": ingest,
           "ps_cpu_s": ps.cpu_s, "ps_rss_kib": ps.maxrss_kib,
           "x_floor": ps.seconds / fl["seconds"], "x_floor_ingest": (ingest or 0) / fl["seconds"],
           "x_floor_wall": ps.seconds / fl["wall_with_startup_s"],
           "uncached": rz.tokenizer_stats(run_dir).get("tokens_tokenised")}
    if profile:
        out["profile"] = rz.profile(f"`analyze` on `{rel(log)}`, {rz.tok_label(spec)}", cmd,
                                    OUT / f"profile-floor-{log.stem}-{rz.tok_tag(spec)}.txt", lg)
    return out


def run_row(scale: str, repeats: int, lg: Path, profile: bool = False) -> RowResult:
    res = RowResult(8, "`analyze` on the realistic chat logs vs the physical floor (read + JSON-parse + tokenise "
                    "only the uncached tokens, all cores)", "bench/floor.py on the same file",
                    f"<= {TARGET}x the floor")
    load_before = rz.loadavg()
    tok = f"hf:{rel(inputs.tokenizer_dir(lg))}"
    logs = [rz.real_text_log(rz.REAL_ISSUE_N, lg), rz.real_text_log(rz.REAL_N[scale], lg)]
    # Row 1 profiles the big log's commands; this row profiles the 12k log's (the same analyze commands).
    rows = [one(log, spec, repeats, res, lg, profile and log == logs[0]) for log in logs
            for spec in (rz.DEFAULT_TOKENIZER, tok) if scale == "full" or log == logs[0] or spec != tok]
    worst = max(r["x_floor"] for r in rows)
    res.measured = "; ".join(f"{Path(r['log']).stem} {rz.tok_tag(r['tokenizer'])}: floor {fmt_s(r['floor']['seconds'])}"
                             f", prefixscan {fmt_s(r['ps_s'])}" for r in rows)
    res.ratio = "; ".join(f"{Path(r['log']).stem} {rz.tok_tag(r['tokenizer'])}: {r['x_floor']:.1f}x "
                          f"(ingest {r['x_floor_ingest']:.1f}x)" for r in rows)
    res.verdict = "met" if worst <= TARGET else f"gap: up to {worst:.1f}x the floor > {TARGET}x"
    for r in rows:
        f = r["floor"]
        res.details.append(
            f"{r['log']}, {rz.tok_label(r['tokenizer'])}: floor {fmt_s(f['seconds'])} (runs "
            f"{[round(x, 2) for x in f['seconds_all']]}; {f['workers']} processes; {f['wall_with_startup_s']:.2f} s "
            f"with interpreter start and tokenizer load) tokenising {f['tokens_tokenised']:,} tokens of "
            f"{f['requests']:,} requests; prefixscan tokenised {r['uncached'] or 0:,}; prefixscan analyze "
            f"{fmt_s(r['ps_s'])} (CPU {r['ps_cpu_s']:.1f} s, peak RSS {r['ps_rss_kib'] / 1024:,.0f} MiB; the floor's "
            f"processes: CPU {f['cpu_s']:.1f} s with start-up) = "
            f"**{r['x_floor']:.2f}x** the floor ({r['x_floor_wall']:.2f}x the floor with its start-up); its ingest "
            f"stage {fmt_s(r['ingest_s'])} = {r['x_floor_ingest']:.2f}x")
    res.details += [
        "the floor tokenises the uncached tail of each prompt's message texts, as many characters as follow "
        "the ideal-cache hit (chat markup left out: a few tokens per message); its token count matching "
        "prefixscan's tokenised count shows it does the same tokenisation work",
        f"load average before the row: {load_before}; after: {rz.loadavg()} (2 cores shared with other jobs)",
    ]
    for r in rows:
        res.details += r.get("profile", [])
    res.data = {f"{Path(r['log']).stem}-{rz.tok_tag(r['tokenizer'])}": {k: v for k, v in r.items() if k != "profile"}
                for r in rows}
    return res
