"""Row 2: `prefixscan analyze` vs `kvlint analyze` (PyPI) on the same chat requests and tokenizer directory.

kvlint keeps every request's rendered text, token ids and per-token character offsets in Python lists,
so it needs ~1 GB of RAM per ~1,000 8k-token requests; it runs on the log's first N requests (stated in
results.md) and prefixscan runs on exactly the same file. kvlint reads `timestamp` only as a number, so
the file given to both tools has synth's ISO timestamps converted to epoch seconds (nothing else changes).
Hit rate compared: token-weighted (sum cached / sum prompt tokens), infinite cache, vLLM 16-token blocks.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import inputs
import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq
from common import OUT, PEERS_BIN, RowResult, analyze_cmd, fmt_s, head_lines, human_bytes, measure_rss, median, rel

# kvlint needs ~1.5 GiB per 1,000 of these requests: 10,000 (~15 GiB) is the largest prefix of the log that
# fits this 24 GiB machine with room to spare, and the longer run amortises both tools' start-up alike.
KVLINT_N = {"small": 1_000, "full": 10_000}


def numeric_copy(src: Path, n: int, dst: Path) -> Path:
    """The first `n` records of `src` with ISO timestamps as epoch seconds (kvlint reads numbers)."""
    def numeric(line: bytes) -> bytes:
        o = orjson.loads(line)
        ts = o.get("timestamp")
        if isinstance(ts, str):
            o["timestamp"] = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
        return orjson.dumps(o) + b"\n"

    return head_lines(src, n, dst, numeric)


def run_row(scale: str, repeats: int, lg: Path) -> RowResult:
    res = RowResult(2, "same chat log, `analyze`", "`kvlint analyze` (PyPI), same tokenizer directory",
                    ">= 10x faster, token-weighted hit rate within 0.1 point")
    kv = PEERS_BIN / "kvlint"
    if not kv.exists():
        res.verdict = "not run: kvlint not installed in bench/out/peers-venv"
        return res
    tok = inputs.tokenizer_dir(lg)
    log = inputs.chat_log(scale, lg)
    n = KVLINT_N[scale]
    sub = numeric_copy(log, n, OUT / f"chat-{scale}-head{n}-numts.jsonl")

    run_dir = OUT / f"run-kvlint-input-{scale}"
    pcmd = analyze_cmd([sub], run_dir, "--tokenizer", f"hf:{rel(tok)}")
    report = OUT / f"kvlint-{scale}.json"
    kcmd = [str(kv), "analyze", rel(sub), "--model", rel(tok), "--engine", "vllm", "--block-size", "16",
            "--json", rel(report)]
    res.cmd(pcmd)
    res.cmd(kcmd)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    ps_runs = [measure_rss(pcmd, log=lg) for _ in range(repeats)]
    kv_runs = []
    for _ in range(repeats if scale == "small" else 1):
        r = measure_rss(kcmd, env=env, check=False, log=lg)
        kv_runs.append(r)
        if r.rc != 0:
            break
    if kv_runs[-1].rc != 0:
        err = (kv_runs[-1].stderr or kv_runs[-1].stdout).strip().splitlines()[-5:]
        res.verdict = "peer failed"
        res.details.append(f"kvlint exited {kv_runs[-1].rc}: `{' / '.join(err)[:400]}`")
        return res
    rep = json.loads(report.read_text())
    sims = rep.get("sims") or []
    kv_hit = next(s["hit_rate"] for s in sims if s.get("engine") == "vllm")
    summ = pq.read_table(run_dir / "summaries.parquet").to_pylist()
    allrow = next(r for r in summ if r["dimension"] == "all")
    ps_hit = allrow["token_weighted"]
    req = pq.read_table(run_dir / "requests.parquet", columns=["prompt_tokens"])
    tokens = int(pc.sum(req["prompt_tokens"]).as_py())
    t_ps, t_kv = median([r.seconds for r in ps_runs]), median([r.seconds for r in kv_runs])
    ratio = t_kv / t_ps
    diff_pt = abs(ps_hit - kv_hit) * 100
    res.measured = (f"first {n:,} req ({tokens / 1e6:.1f}M tok): prefixscan {fmt_s(t_ps)}, kvlint {fmt_s(t_kv)}; "
                    f"hit {ps_hit:.4%} vs {kv_hit:.4%} ({diff_pt:.3f} pt)")
    res.ratio = f"{ratio:.1f}x"
    gaps = [f"speed {ratio:.1f}x < 10x" if ratio < 10 else "", f"hit differs {diff_pt:.3f} pt" if diff_pt > 0.1 else ""]
    res.verdict = "met" if not any(gaps) else "gap: " + ", ".join(g for g in gaps if g)
    res.details += [
        f"input: first {n:,} requests of `{rel(log)}` with numeric timestamps (`{rel(sub)}`), "
        f"{tokens:,} prompt tokens",
        f"prefixscan: median {fmt_s(t_ps)} of {[round(r.seconds, 2) for r in ps_runs]}, peak RSS "
        f"{human_bytes(max(r.maxrss_kib for r in ps_runs) * 1024)}",
        f"kvlint {rep.get('version', '')}: median {fmt_s(t_kv)} of {[round(r.seconds, 2) for r in kv_runs]}, "
        f"peak RSS {human_bytes(max(r.maxrss_kib for r in kv_runs) * 1024)} (vLLM engine only, infinite budget)",
        f"token-weighted ideal hit rate: prefixscan {ps_hit:.6f}, kvlint {kv_hit:.6f}. kvlint counts "
        "hits x block size (no last-token cap); prefixscan uses vLLM's min(k, floor((n-1)/B)) x B, so "
        "prefixscan can only be lower, by at most one block on requests whose every full block hits",
        f"why a subsample: kvlint holds rendered text, ids and per-token offsets of every request in memory "
        f"(peak RSS above for {n:,} requests); the whole log would not fit in this machine's 24 GiB",
    ]
    res.data = {"ps_s": [r.seconds for r in ps_runs], "kvlint_s": [r.seconds for r in kv_runs],
                "ps_hit": ps_hit, "kvlint_hit": kv_hit, "requests": n, "tokens": tokens,
                "kvlint_maxrss_kib": max(r.maxrss_kib for r in kv_runs),
                "ps_maxrss_kib": max(r.maxrss_kib for r in ps_runs)}
    return res
