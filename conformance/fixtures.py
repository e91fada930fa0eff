"""Write the recorded engine results as small committed fixtures (conformance/fixtures/, format in its README).

Per family: `workload.jsonl.gz` (the chat log, byte for byte) and `vllm.jsonl.gz`, one line per run of the
engine or the scheduler driver: its header (kind, block size, pool, hash algorithm, PYTHONHASHSEED, vLLM
version) and per request the prompt length, the digest of the prompt ids, the cached tokens and (for the
unbounded runs only: hash values do not depend on the pool) the full-block hashes. gzip with mtime 0, so
the same results give the same bytes. The bpe family's tokenizer files are copied too (30 KB).

Usage: python -m conformance.fixtures OUT_ROOT FIXTURES_DIR [--families bpe,deepseek,mistral]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def gz(path: Path, data: bytes) -> None:
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))


def run_line(path: Path) -> dict:
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    head, rows = lines[0], lines[1:]
    out = {"run": path.stem, "header": head, "request_id": [r["request_id"] for r in rows],
           "prompt_tokens": [r["prompt_tokens"] for r in rows], "digest": [r["digest"] for r in rows],
           "cached_tokens": [r["cached_tokens"] for r in rows]}
    if not head["bounded"] and head["hash_algo"]:
        out["block_hashes"] = [r["block_hashes"] for r in rows]
    return out


def export_family(root: Path, fam: str, dest: Path) -> int:
    """Write one family's fixtures; returns the bytes written."""
    d = dest / fam
    d.mkdir(parents=True, exist_ok=True)
    gz(d / "workload.jsonl.gz", (root / fam / "workload.jsonl").read_bytes())
    runs = sorted((root / fam / "results").glob("*.jsonl"))
    gz(d / "vllm.jsonl.gz", "".join(json.dumps(run_line(p), sort_keys=True) + "\n" for p in runs).encode())
    if fam == "bpe":
        tok = d / "tokenizer"
        tok.mkdir(exist_ok=True)
        for name in TOKENIZER_FILES:
            if (root / "models" / fam / name).exists():
                shutil.copyfile(root / "models" / fam / name, tok / name)
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("dest")
    ap.add_argument("--families", default="bpe,deepseek,mistral")
    a = ap.parse_args()
    for fam in a.families.split(","):
        if (Path(a.root) / fam / "results").exists():
            n = export_family(Path(a.root), fam, Path(a.dest))
            print(f"{a.dest}/{fam}: {n:,} bytes")


if __name__ == "__main__":
    main()
