"""`make bench`: run the benchmark rows of issue 6 and write bench/results.md and bench/results.json.

    .venv/bin/python bench/run.py [--rows 1,3,4] [--scale small|full] [--repeats 3] [--no-profile]

Inputs are made by `prefixscan synth` with fixed seeds and cached in bench/out (gitignored). Peer tools are
installed into their own virtual environment, bench/out/peers-venv, never into the project's. Each row
lives in its own module (bench/rowN_*.py) and returns a `common.RowResult`; a row that fails is reported
as failed and the others still run. See docs/bench.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BENCH,
    OUT,
    PEERS,
    PEERS_BIN,
    PS,
    PY,
    ROOT,
    RowResult,
    collapsed_stacks,
    machine_info,
    rel,
    run,
    versions,
    write_markdown,
)

ROWS = {1: "row1_tokenize", 2: "row2_kvlint", 3: "row3_aiperf", 4: "row4_capacity", 5: "row5_simulate",
        6: "row6_simulate_chat", 7: "row7_memory", 8: "row8_floor", 9: "row9_scaling",
        10: "row10_sampled_capacity"}
PROFILED_ROWS = (1, 8, 9)  # rows that profile their own commands (py-spy) unless --no-profile
PEER_PACKAGES = ["kvlint", "aiperf", "kvcache-simulator", "py-spy", "pyinstrument"]
ROW_PEERS = {2: "kvlint", 3: "aiperf", 4: "kvcache-simulator"}  # the peer tool a row runs; profilers always


def ensure_peers(lg: Path, rows: list[int] | None = None) -> str:
    """Create bench/out/peers-venv and install the peer tools there (once): those of `rows` (default all)
    and the profilers. Returns a status line."""
    if not (PEERS_BIN / "python").exists():
        run([sys.executable, "-m", "venv", str(PEERS)], log=lg)
    wanted = [p for p in PEER_PACKAGES if rows is None or p not in ROW_PEERS.values()
              or any(ROW_PEERS.get(n) == p for n in rows)]
    have = versions(str(PEERS_BIN / "python"), wanted)
    missing = [p for p, v in have.items() if v == "not installed"]
    if missing:
        r = run([str(PEERS_BIN / "pip"), "install", "-q", *missing], check=False, log=lg)
        if r.rc != 0:
            return f"pip install {' '.join(missing)} failed (rc={r.rc}): {r.stderr.strip()[-300:]}"
    return "ok"


def _one_profile(label: str, args: list[str], raw: Path, lg: Path) -> list[str]:
    cmd = [str(PEERS_BIN / "py-spy"), "record", "--format", "raw", "-o", rel(raw), "--rate", "100", "--", PS,
           *args, "-q"]
    r = run(cmd, check=False, log=lg)
    if r.rc != 0 or not raw.exists():
        return ["", f"### {label}", "", f"py-spy failed (rc={r.rc}): `{r.stderr.strip()[-300:]}`"]
    own, total, samples = collapsed_stacks(raw)
    out = ["", f"### {label}", "", f"`{shlex.join(cmd).replace(str(ROOT) + '/', '')}` ({samples:,} samples at "
           f"100 Hz, {r.seconds:.1f} s wall). Raw collapsed stacks: `{rel(raw)}`.", "",
           "Top functions by own time (the line that was running):", "", "| own % | function |", "|---:|---|"]
    out += [f"| {c / samples:.1%} | `{k}` |" for k, c in own.most_common(15)]
    out += ["", "Top prefixscan functions by total time (including callees):", "", "| total % | function |",
            "|---:|---|"]
    ps_total = [(k, c) for k, c in total.most_common() if "prefixscan/" in k and "<module>" not in k]
    out += [f"| {c / samples:.1%} | `{k}` |" for k, c in ps_total[:15]]
    return out


def profile(scale: str, lg: Path) -> list[str]:
    """py-spy samples of `prefixscan analyze` on the small chat log (10k requests, ~80M tokens) and the
    100k-request trace, at any scale: top functions by own time and prefixscan functions by total time."""
    import inputs

    if not (PEERS_BIN / "py-spy").exists():
        return ["", "## Profile", "", "py-spy is not installed in bench/out/peers-venv; no profile."]
    tok = inputs.tokenizer_dir(lg)
    chat = inputs.chat_log("small", lg)
    trace = inputs.trace(100_000, lg)
    out = ["", "## Profile (py-spy)"]
    out += _one_profile(f"`analyze` on `{rel(chat)}` (10,000 chat requests, HF tokenizer)",
                        ["analyze", rel(chat), "-o", rel(OUT / "run-profile-chat"), "--tokenizer", f"hf:{rel(tok)}",
                         "--force"],
                        OUT / "profile-chat.txt", lg)
    out += _one_profile(f"`analyze` on `{rel(trace)}` (100,000-request Mooncake trace)",
                        ["analyze", rel(trace), "-o", rel(OUT / "run-profile-trace"), "--force"],
                        OUT / "profile-trace.txt", lg)
    out += _one_profile("`simulate` on the chat run (10,000 requests, 16 replicas, policy round_robin)",
                        ["simulate", rel(OUT / "run-profile-chat"), "--replicas", "16", "--policies", "round_robin",
                         "--no-decision-log", "--no-save"], OUT / "profile-simulate.txt", lg)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8,9")
    ap.add_argument("--scale", choices=["small", "full"], default="small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--keep-inputs", action="store_true", help="keep row 7's big inputs after the run")
    ap.add_argument("--output", default=str(BENCH / "results.md"))
    ap.add_argument("--append", action="store_true",
                    help="keep the other rows (and the profile) of an earlier run at the same scale in --output")
    args = ap.parse_args()
    rows = [int(x) for x in args.rows.split(",") if x.strip()]
    OUT.mkdir(parents=True, exist_ok=True)
    stem = Path(args.output).stem
    lg = OUT / (f"bench-{args.scale}.log" if stem in ("results", "results-full") else f"bench-{stem}.log")
    args.log_path = lg
    previous, prev_profile = _previous(args) if args.append else ([], [])
    if not args.append:
        lg.write_text("")
    meta = {"command": "python bench/run.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
            "scale": args.scale, "repeats": args.repeats, "machine": machine_info()}
    if getattr(args, "previous_command", ""):
        meta["command"] = args.previous_command + "`, then `" + meta["command"]
    peers = ensure_peers(lg, rows)
    meta["machine"]["peers_venv"] = f"{rel(PEERS)} ({peers})"
    ps_ver = subprocess.run([PS, "--version"], capture_output=True, text=True).stdout.strip()
    meta["versions"] = {
        "prefixscan venv (.venv)": {"prefixscan": ps_ver or "?",
                                    **versions(PY, ["transformers", "tokenizers", "numba", "numpy", "polars",
                                                    "pyarrow"])},
        "peers venv (bench/out/peers-venv)": versions(str(PEERS_BIN / "python"), PEER_PACKAGES + ["transformers"]),
    }
    results: list[RowResult] = [r for r in previous if r.row not in rows]
    for n in rows:
        mod = importlib.import_module(ROWS[n])
        t0 = time.perf_counter()
        print(f"[bench] row {n} ({args.scale}) ...", flush=True)
        try:
            kw = {"keep": args.keep_inputs} if n == 7 else {}
            if n in PROFILED_ROWS:
                kw["profile"] = not args.no_profile
            res = mod.run_row(args.scale, args.repeats, lg, **kw)
        except Exception as exc:  # a failing row is reported, the others still run
            res = RowResult(n, ROWS[n], "", "", verdict=f"failed: {type(exc).__name__}")
            res.details.append("```\n" + traceback.format_exc()[-2500:] + "\n```")
        res.details.append(f"row wall time including input generation: {time.perf_counter() - t0:,.0f} s")
        print(f"[bench] row {n}: {res.verdict} | {res.measured} | {res.ratio}", flush=True)
        results.append(res)
        results.sort(key=lambda r: r.row)
        _write(args, meta, results, prev_profile)
    # Rows 1, 8 and 9 profile their own commands; the general profile is for the other rows' inputs.
    own = set(rows) <= set(PROFILED_ROWS)
    extra = prev_profile if args.no_profile or own else profile(args.scale, lg)
    _write(args, meta, results, extra)
    print(f"[bench] wrote {args.output}", flush=True)


def _previous(args: argparse.Namespace) -> tuple[list[RowResult], list[str]]:
    """Rows and profile of an earlier results.json at the same scale (for --append)."""
    p = Path(args.output).with_suffix(".json")
    if not p.exists():
        return [], []
    doc = json.loads(p.read_text())
    if doc.get("meta", {}).get("scale") != args.scale:
        return [], []
    args.previous_command = doc["meta"].get("command", "")
    return [RowResult(**r) for r in doc.get("rows", [])], doc.get("profile", [])


def _write(args: argparse.Namespace, meta: dict, results: list[RowResult], extra: list[str]) -> None:
    out = Path(args.output)
    write_markdown(out, meta, results, extra + ["", f"Full command log: `{rel(args.log_path)}`."])
    out.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "rows": [r.__dict__ for r in results], "profile": extra}, indent=1, default=str))


if __name__ == "__main__":
    main()

