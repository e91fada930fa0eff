"""File permissions of what a run writes: the inputs' own, within the umask.

Logs hold customer text, and so do the tables and reports made from them: when the inputs are readable
by their owner only (0600), a run's files must not be readable by anyone else. Every file of a run gets
one mode, the read/write bits that every input grants and the umask allows (directories add the matching
x bits); `analyze` records it in the manifest (`file_mode`) for the commands that add files later
(`prefixscan.run.rundir.run_mode` reads it back).
"""

from __future__ import annotations

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


def parse_mode(value: object) -> int | None:
    """A recorded `file_mode` ("0640"), or None when it is not a sane file mode: octal text of read/write
    bits only (within 0o666; no x, setuid, setgid or sticky bit), as `input_mode` produces."""
    if not isinstance(value, str) or not 0 < len(value) <= 4 or not set(value) <= set("01234567"):
        return None
    mode = int(value, 8)
    return mode if mode & ~0o666 == 0 else None


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
