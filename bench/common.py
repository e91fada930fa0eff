"""Shared helpers for the benchmark rows: timing with medians, peak RSS of subprocesses, machine info,
version capture, cached input generation and the markdown writer.

Every figure a row reports as a ratio is measured in the same run as its baseline, because these machines
are shared and noisy: absolute seconds drift between runs, ratios much less.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
OUT = BENCH / "out"
VENV_BIN = ROOT / ".venv" / "bin"
PS = str(VENV_BIN / "prefixscan")
PY = str(VENV_BIN / "python")
PEERS = OUT / "peers-venv"
PEERS_BIN = PEERS / "bin"


def revision_tree(rev: str, into: Path) -> Path:
    """`prefixscan/` of git revision `rev`, unpacked under `into` (the directory to put on PYTHONPATH): the
    "before" tree of the before/after benches."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "prefixscan"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


@dataclass
class Run:
    """One subprocess run: wall seconds, peak RSS of that process (KiB), exit code, captured output."""

    cmd: list[str]
    seconds: float
    maxrss_kib: int
    rc: int
    stdout: str
    stderr: str
    cpu_s: float = 0.0  # user + system CPU seconds of the command and its reaped children (`measure_rss`)


def run(cmd: list[str], *, check: bool = True, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float | None = None, log: Path | None = None) -> Run:
    """Run `cmd`, timing it and reading its own peak RSS with wait4 (not the sum over all children)."""
    full_env = {**os.environ, **(env or {})}
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env, cwd=cwd or ROOT,
                         text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        err += f"\n[bench] killed after {timeout} s timeout"
    # communicate() already reaped the child; its rusage is in RUSAGE_CHILDREN only cumulatively, so
    # commands whose RSS matters are run through `measure_rss` below.
    dt = time.perf_counter() - t0
    r = Run(cmd, dt, 0, p.returncode, out, err)
    if log is not None:
        with open(log, "a") as f:
            f.write(f"$ {shlex.join(cmd)}\n[rc={p.returncode} {dt:.2f}s]\n{out[-4000:]}\n{err[-4000:]}\n")
    if check and p.returncode != 0:
        raise RuntimeError(f"command failed (rc={p.returncode}): {shlex.join(cmd)}\n{err[-3000:]}")
    return r


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _tree_rss_kib(pid: int) -> int:
    """RSS of a process and all its descendants (analyze's encode workers are separate processes)."""
    return _rss_kib(pid) + sum(_tree_rss_kib(c) for c in _children(pid))


def measure_rss(cmd: list[str], *, check: bool = True, env: dict[str, str] | None = None,
                log: Path | None = None, guard_kib: int | None = None) -> Run:
    """Run `cmd` and return its wall time and its peak RSS in KiB: the larger of its own ru_maxrss (wait4 in
    `rss_shim.py`) and the peak of its process tree's summed RSS sampled every 0.2 s (encode workers).

    With `guard_kib`, the process is killed once its RSS passes that many KiB (a shared machine must not be
    driven out of memory by a benchmark); the result then has rc -9 and says so in stderr."""
    full_env = {**os.environ, **(env or {})}
    guard_hit = False
    peak_file = OUT / f".rss_peak.{os.getpid()}"
    peak_file.unlink(missing_ok=True)
    shim = [sys.executable, str(Path(__file__).parent / "rss_shim.py"), str(peak_file)]
    with open(OUT / f".rss_stdout.{os.getpid()}", "w+") as fo, open(OUT / f".rss_stderr.{os.getpid()}", "w+") as fe:
        t0 = time.perf_counter()
        # The command runs as the child of a small shim: its ru_maxrss is then its own (see rss_shim.py).
        p = subprocess.Popen(shim + cmd, stdout=fo, stderr=fe, env=full_env, cwd=ROOT)
        tree_peak = 0
        while True:
            wpid, status, _ = os.wait4(p.pid, os.WNOHANG)
            if wpid:
                break
            kids = _children(p.pid)
            tree = sum(_tree_rss_kib(k) for k in kids)  # the command and its worker processes, summed
            tree_peak = max(tree_peak, tree)
            if guard_kib and kids and tree > guard_kib:
                guard_hit = True
                os.kill(kids[0], 9)
                _, status, _ = os.wait4(p.pid, 0)
                break
            time.sleep(0.2)
        dt = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read(), fe.read()
    if guard_hit:
        err += f"\n[bench] killed: RSS passed the {guard_kib / 2**20:.0f} GiB guard after {dt:.0f} s"
    # ru_maxrss is the largest single process's peak; with encode workers the sum over the process tree,
    # sampled every 0.2 s, is larger: report whichever is larger.
    shim_out = (peak_file.read_text().split() if peak_file.exists() else []) + ["0", "0", "0"]
    maxrss = max(int(shim_out[0]), tree_peak)
    peak_file.unlink(missing_ok=True)
    r = Run(cmd, dt, maxrss, p.returncode, out, err, cpu_s=float(shim_out[1]) + float(shim_out[2]))
    if log is not None:
        with open(log, "a") as f:
            f.write(f"$ {shlex.join(cmd)}\n[rc={p.returncode} {dt:.2f}s cpu={r.cpu_s:.2f}s maxrss={maxrss} KiB]\n"
                    f"{out[-4000:]}\n{err[-4000:]}\n")
    if check and r.rc != 0:
        raise RuntimeError(f"command failed (rc={r.rc}): {shlex.join(cmd)}\n{err[-3000:]}")
    return r


_MEASURED: dict[str, Run] = {}
_MEASURED_FILE = OUT / "measured.json"


_CODE: list[str] = []


def code_version() -> str:
    """The prefixscan code a measurement was made with: the commit, plus a digest of any uncommitted change."""
    if not _CODE:
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

        diff = git("diff", "HEAD", "--", "prefixscan")
        dirty = "+" + hashlib.sha1(diff.encode()).hexdigest()[:12] if diff else ""
        _CODE.append(git("rev-parse", "HEAD") + dirty)
    return _CODE[0]


def _key(cmd: list[str]) -> str:
    """The command line, the code version, and size and mtime of every file it names: a measurement is
    reusable while they all hold (a measurement of older code is never reused)."""
    files = []
    for a in cmd:
        p = Path(a) if Path(a).is_absolute() else ROOT / a
        if p.is_file():
            st = p.stat()
            files.append(f"{a}:{st.st_size}:{int(st.st_mtime)}")
    return shlex.join(cmd) + " || " + " ".join(files) + " || code " + code_version()


def remember(cmd: list[str], r: Run) -> None:
    """Record a successful measurement so later rows (also in later bench processes) can reuse it."""
    if r.rc != 0:
        return
    k = _key(cmd)
    _MEASURED[k] = r
    try:
        doc = json.loads(_MEASURED_FILE.read_text()) if _MEASURED_FILE.exists() else {}
    except ValueError:
        doc = {}
    doc[k] = {"seconds": r.seconds, "maxrss_kib": r.maxrss_kib, "cpu_s": r.cpu_s,
              "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    _MEASURED_FILE.write_text(json.dumps(doc, indent=1))


def measure_rss_cached(cmd: list[str], *, log: Path | None = None, guard_kib: int | None = None) -> Run:
    """`measure_rss`, reusing a measurement of the identical command on unchanged files made earlier by any
    bench process (bench/out/measured.json), when the command's output directory still exists."""
    k = _key(cmd)
    if k in _MEASURED:
        return _MEASURED[k]
    out_dir = cmd[cmd.index("-o") + 1] if "-o" in cmd else None
    if _MEASURED_FILE.exists() and out_dir and Path(out_dir).is_dir():
        try:
            hit = json.loads(_MEASURED_FILE.read_text()).get(k)
        except ValueError:
            hit = None
        if hit:
            r = Run(cmd, hit["seconds"], hit["maxrss_kib"], 0, "", f"[reused measurement from {hit['when']}]",
                    cpu_s=hit.get("cpu_s", 0.0))
            _MEASURED[k] = r
            return r
    r = measure_rss(cmd, log=log, guard_kib=guard_kib, check=guard_kib is None)
    remember(cmd, r)
    return r


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def timed(fn: Any, repeats: int) -> tuple[float, list[float], Any]:
    """Median seconds of `fn()` over `repeats` calls, all timings, and the last return value."""
    times, last = [], None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - t0)
    return median(times), times, last


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_s(x: float | None) -> str:
    if x is None or x != x:
        return "n/a"
    return f"{x:,.2f} s" if x >= 1 else f"{x * 1000:,.1f} ms"


# -- inputs ------------------------------------------------------------------------------------------

def cached(path: Path, params: dict[str, Any], make: Any) -> Path:
    """Build `path` with `make(path)` unless it exists with the same parameters (stored beside it)."""
    meta = path.with_name(path.name + ".params.json")
    want = json.dumps(params, sort_keys=True)
    if path.exists() and meta.exists() and meta.read_text() == want:
        return path
    if path.exists():
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    make(path)
    meta.write_text(want)
    return path


def head_lines(src: Path, n: int, dst: Path, transform: Callable[[bytes], bytes] | None = None) -> Path:
    """The first `n` lines of `src` in `dst`, each through `transform` if given (made once per source,
    count and size)."""
    stamp, want = dst.with_name(dst.name + ".n"), f"{rel(src)}:{n}:{src.stat().st_size}"
    if dst.exists() and stamp.exists() and stamp.read_text() == want:
        return dst
    with open(src, "rb") as f, open(dst, "wb") as g:
        for i, line in enumerate(f):
            if i >= n:
                break
            g.write(transform(line) if transform is not None else line)
    stamp.write_text(want)
    return dst


def synth(path: Path, *, requests: int, seed: int, fmt: str = "jsonl", scenario: str = "chat",
          extra: list[str] | None = None, log: Path | None = None) -> Path:
    """A `prefixscan synth` output, generated once per parameter set with a fixed seed."""
    args = ["-n", str(requests), "--seed", str(seed), "-f", fmt, "-s", scenario, "--no-truth", "-q",
            *(extra or [])]

    def make(p: Path) -> None:
        run([PS, "synth", "-o", str(p), *args], log=log)

    return cached(path, {"synth": args}, make)


def analyze_cmd(inputs: list[Path], out: Path, *extra: str) -> list[str]:
    return [PS, "analyze", *map(str, inputs), "-o", str(out), "--force", "-q", *extra]


# -- environment --------------------------------------------------------------------------------------

def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        info["memory"] = human_bytes(int(mem) * 1024)
        info["loadavg_at_start"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                            capture_output=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "prefixscan"], cwd=ROOT, text=True,
                               capture_output=True).stdout.strip()
        info["prefixscan_tree"] = "modified (uncommitted changes under prefixscan/)" if dirty else "clean"
    except OSError:
        pass
    return info


def versions(py: str, packages: list[str]) -> dict[str, str]:
    """Installed versions of `packages` in the interpreter `py` ('not installed' when absent)."""
    code = ("import importlib.metadata as m, json, sys\nout = {}\nfor p in sys.argv[1:]:\n"
            "    try: out[p] = m.version(p)\n    except Exception: out[p] = 'not installed'\nprint(json.dumps(out))")
    if not Path(py).exists():
        return {p: "not installed" for p in packages}
    r = subprocess.run([py, "-c", code, *packages], text=True, capture_output=True)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {p: "unknown" for p in packages}


# -- results -------------------------------------------------------------------------------------------

@dataclass
class RowResult:
    """What one benchmark row reports: the table line plus details and command lines for results.md."""

    row: int
    workload: str
    compared_with: str
    target: str
    measured: str = ""
    ratio: str = ""
    verdict: str = "not run"
    details: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def cmd(self, cmd: list[str] | str) -> None:
        text = cmd if isinstance(cmd, str) else shlex.join(cmd)
        self.commands.append(text.replace(str(ROOT) + "/", ""))


def rel(p: Path | str) -> str:
    try:
        return str(Path(p).resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def write_markdown(path: Path, meta: dict[str, Any], rows: list[RowResult], extra: list[str]) -> None:
    lines = ["# prefixscan benchmark results", "",
             f"Generated by `{meta['command']}` at {meta['machine'].get('date_utc')} UTC, scale `{meta['scale']}`, "
             f"{meta['repeats']} repeat(s) per timing (medians reported). Every ratio compares two figures "
             "measured in the same run on the same machine.", "", "## Machine and versions", ""]
    for k, v in meta["machine"].items():
        lines.append(f"- {k}: {v}")
    for venv, vers in meta["versions"].items():
        lines.append(f"- {venv}: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    lines += ["", "## Summary", "", "| # | workload | compared with | target | measured | ratio | verdict |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [str(r.row), r.workload, r.compared_with, r.target, r.measured, r.ratio, r.verdict]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    for r in rows:
        lines += ["", f"## Row {r.row}: {r.workload}", ""]
        lines += [d if (d.startswith("|") or not d) else f"- {d}" for d in r.details] or ["- (no details)"]
        if r.commands:
            lines += ["", "Command lines:", "", "```"] + r.commands + ["```"]
    fixed: list[str] = []
    for ln in lines:
        if ln.startswith("|") and fixed and fixed[-1].startswith("- "):
            fixed.append("")
        fixed.append(ln)
    lines = fixed + extra
    path.write_text("\n".join(lines) + "\n")


def _frame(f: str) -> str:
    """A py-spy frame as `function (path)`, the path relative to site-packages or the repository."""
    fn, _, loc = f.partition(" (")
    path = loc.split(":")[0]
    for cut in ("site-packages/", str(ROOT) + "/"):
        if cut in path:
            path = path.split(cut, 1)[1]
    return f"{fn} ({path})"


def raw_stacks(raw: Path, skip: tuple[str, ...] = ("process ",)) -> Iterator[tuple[list[str], int]]:
    """(frames as `_frame` names, samples) of each stack of a py-spy `--format raw` file, root first; frames
    starting with one of `skip` (`process ...` from `--subprocesses`, `thread ...` from `--threads`) are not
    functions and are left out."""
    for line in raw.read_text().splitlines():
        stack, _, cnt = line.rpartition(" ")
        if stack and cnt.isdigit():
            frames = [f.strip() for f in stack.split(";")]
            yield [_frame(f) for f in frames if f and not f.startswith(skip)], int(cnt)


def collapsed_stacks(raw: Path) -> tuple[Counter[str], Counter[str], int]:
    """(samples by own function, samples by function anywhere on the stack, total samples) of a py-spy
    `--format raw` file (`raw_stacks`)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for names, c in raw_stacks(raw):
        samples += c
        if not names:
            continue
        own[names[-1]] += c
        for nm in set(names):
            total[nm] += c
    return own, total, samples
