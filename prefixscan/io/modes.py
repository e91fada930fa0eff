"""File permissions of what a run writes: the inputs' own, within the umask.

Logs hold customer text, and so do the tables and reports made from them: when the inputs are readable
by their owner only (0600), a run's files must not be readable by anyone else. Every file of a run gets
one mode, the read/write bits that every input grants and the umask allows (directories add the matching
x bits); `analyze` records it in the manifest (`file_mode`) for the commands that add files later.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

MANIFEST_KEY = "file_mode"


def current_umask() -> int:
    """The process umask, read without changing it (changing it, even briefly, races with other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def input_mode(paths: Iterable[str | os.PathLike[str]]) -> int:
    """The mode of a run's files: rw bits every input grants, within what the umask allows."""
    mode = 0o666 & ~current_umask()
    for p in paths:
        try:
            mode &= os.stat(p).st_mode & 0o666
        except OSError:
            continue  # an input that cannot be stat-ed now (stdin, a removed file) adds no constraint
    return mode


def dir_mode(mode: int) -> int:
    """A directory's mode for files of `mode`: x wherever r is (and always for the owner)."""
    return mode | 0o100 | ((mode & 0o444) >> 2)


def run_mode(run: str | os.PathLike[str]) -> int | None:
    """The mode `analyze` recorded for this run, if any."""
    try:
        text = json.loads((Path(run) / "manifest.json").read_text()).get(MANIFEST_KEY)
        return int(text, 8) if isinstance(text, str) else None
    except (OSError, ValueError, AttributeError):
        return None


def apply_mode(root: str | os.PathLike[str], mode: int | None, paths: Iterable[Path] | None = None) -> None:
    """Give `paths` (default: every file and directory under `root`, and `root`) the run's mode."""
    if mode is None:
        return
    root = Path(root)
    todo = list(paths) if paths is not None else [root, *root.rglob("*")]
    for p in todo:
        try:
            if p.is_symlink():
                continue
            os.chmod(p, dir_mode(mode) if p.is_dir() else mode)
        except OSError:
            continue  # a file another process removed meanwhile; permissions are best effort, never fatal
