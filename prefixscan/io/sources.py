"""Expanding input arguments (files, directories, globs) and fingerprinting them for the manifest."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

import xxhash

from prefixscan.errors import InputError

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz", ".parquet", ".pq")


@dataclass(frozen=True)
class Source:
    """One input file and what the manifest records about it."""

    path: str
    size: int
    fingerprint: str
    kind: str  # "jsonl" or "parquet"

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "fingerprint": self.fingerprint, "kind": self.kind}


def _kind(path: str) -> str | None:
    low = path.lower()
    if low.endswith((".parquet", ".pq")):
        return "parquet"
    if low.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz", ".json", ".json.gz")):
        return "jsonl"
    return None


def fingerprint(path: str, size: int) -> str:
    """Cheap content fingerprint: size plus xxh3 of the first and last MiB (not a full-file hash)."""
    h = xxhash.xxh3_64()
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read(1 << 20))
    return h.hexdigest()


def expand(inputs: list[str]) -> list[Source]:
    """Resolve files, directories (recursively, known suffixes) and globs, sorted, without duplicates."""
    if not inputs:
        raise InputError("no input logs given; pass one or more files, directories or globs")
    paths: list[str] = []
    for arg in inputs:
        if any(ch in arg for ch in "*?["):
            matched = sorted(glob.glob(arg, recursive=True))
            if not matched:
                raise InputError(f"glob {arg!r} matched no files")
            paths.extend(m for m in matched if os.path.isfile(m))
        elif os.path.isdir(arg):
            found = sorted(str(p) for p in Path(arg).rglob("*") if p.is_file() and _kind(str(p)))
            if not found:
                raise InputError(f"directory {arg!r} holds no .jsonl, .jsonl.gz or .parquet files")
            paths.extend(found)
        elif os.path.isfile(arg):
            paths.append(arg)
        else:
            raise InputError(f"input {arg!r} does not exist; check the path")
    seen: set[str] = set()
    out: list[Source] = []
    for p in paths:
        if p in seen:
            continue
        seen.add(p)
        kind = _kind(p)
        if kind is None:
            # Unknown suffix given explicitly: sniff the first byte (PAR1 magic for Parquet).
            with open(p, "rb") as f:
                kind = "parquet" if f.read(4) == b"PAR1" else "jsonl"
        size = os.path.getsize(p)
        out.append(Source(p, size, fingerprint(p, size), kind))
    return out
