"""Expanding input arguments (files, directories, globs) and fingerprinting them for the manifest."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

import xxhash

from prefixscan.errors import InputError, UsageError
from prefixscan.io import remote

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst", ".ndjson", ".ndjson.gz",
            ".ndjson.zst", ".parquet", ".pq")


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
    if low.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst", ".ndjson", ".ndjson.gz", ".ndjson.zst", ".json",
                     ".json.gz", ".json.zst")):
        return "jsonl"
    return None


def fingerprint(path: str, size: int) -> str:
    """Cheap content fingerprint: size plus xxh3 of the first and last MiB (not a full-file hash)."""
    h = xxhash.xxh3_64()
    h.update(str(size).encode())
    with remote.open_random(path) if remote.is_uri(path) else open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read(1 << 20))
    return h.hexdigest()


def skipped_in(inputs: list[str] | tuple[str, ...]) -> list[str]:
    """Files a directory walk passes over (no known log suffix), so the summary can list them."""
    out: list[str] = []
    for arg in inputs:
        if os.path.isdir(arg):
            out += sorted(str(p) for p in Path(arg).rglob("*") if p.is_file() and not _kind(str(p)))
    return out


def expand(inputs: list[str]) -> list[Source]:
    """Resolve files, directories (recursively, known suffixes) and globs, sorted, without duplicates."""
    if not inputs:
        raise InputError("no input logs given; pass one or more files, directories or globs")
    paths: list[str] = []
    stored: dict[str, int] = {}  # objects in a store (`remote`) and their sizes
    for arg in inputs:
        if remote.is_uri(arg):
            found = remote.list_uri(arg, SUFFIXES)
            stored.update(found)
            paths.extend(u for u, _ in found)
        elif any(ch in arg for ch in "*?["):
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
        if p in stored:
            out.append(Source(p, stored[p], fingerprint(p, stored[p]), kind or "jsonl"))
            continue
        if kind is None:
            # Unknown suffix given explicitly: sniff the first byte (PAR1 magic for Parquet).
            try:
                with open(p, "rb") as f:
                    kind = "parquet" if f.read(4) == b"PAR1" else "jsonl"
            except OSError as exc:
                raise InputError(f"cannot read input {p}: {exc.strerror or exc}; check its permissions") from None
        try:
            size = os.path.getsize(p)
            out.append(Source(p, size, fingerprint(p, size), kind))
        except OSError as exc:
            raise InputError(f"cannot read input {p}: {exc.strerror or exc}; check its permissions") from None
    return out


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_output(output: str | os.PathLike[str], inputs: list[str] | tuple[str, ...], sources: list[Source],
                 what: str = "-o") -> None:
    """Refuse, before any work, an output that is an input (symlinks and hard links followed), holds an
    input (replacing it would delete the input), or lies inside an input directory (a later run over that
    directory would read the outputs as logs)."""
    out = os.path.realpath(output)
    try:
        out_id = os.stat(out)[1:3] if os.path.exists(out) else None  # (inode, device)
    except OSError:
        out_id = None
    for src in sources:
        if remote.is_uri(src.path):  # an object in a store is never a local output
            continue
        real = os.path.realpath(src.path)
        same = real == out or (out_id is not None and os.stat(real)[1:3] == out_id)
        if same:
            raise UsageError(f"{what} {output} is the input {src.path}: writing it would destroy the input; "
                             "choose another output path")
        if _inside(real, out):
            raise UsageError(f"{what} {output} holds the input {src.path}: writing there could overwrite or "
                             "delete the input; choose an output outside the inputs")
    for arg in inputs:
        if os.path.isdir(arg) and _inside(out, os.path.realpath(arg)):
            raise UsageError(f"{what} {output} is inside the input directory {arg}: a later run over that "
                             "directory would read the outputs as logs; choose an output outside it")
