"""Atomic file writes: every file prefixscan writes appears complete or not at all.

A file is written under a temporary name in its own directory, flushed to disk and renamed over its target
(a rename within one file system is atomic), so a crash, a kill or a full disk never leaves a truncated file
under a real name. Temporary names all end in TMP_SUFFIX, so the next run recognises and removes what a
killed run left behind. Operating-system failures (disk full, read-only file system, permission denied)
become one-line `EnvError`s naming the path and what to do.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from prefixscan.errors import EnvError, UsageError

TMP_SUFFIX = ".prefixscan-tmp"
# Names older versions used for their temporaries inside a run directory (a table being written, the
# streamed requests table, spill directories): a killed run of theirs left these behind.
_LEGACY_PREFIXES = (".requests.", ".spill.")

_FIXES = {
    errno.ENOSPC: "no space left on the device; free some space or write to another disk",
    errno.EDQUOT: "disk quota exceeded; free some space or write elsewhere",
    errno.EROFS: "the file system is read-only; choose a writable output path",
    errno.EACCES: "permission denied; check the permissions or choose another path",
    errno.EPERM: "operation not permitted; check the permissions or choose another path",
    errno.ENOENT: "no such file or directory; check the path",
    errno.ENOTDIR: "a part of the path is not a directory; check the path",
    errno.EISDIR: "it is a directory; give a file path",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) and re-run",
    errno.EFBIG: "the file is larger than the system allows (ulimit -f?); write elsewhere",
    errno.EIO: "input/output error; check the disk",
}


def env_error(exc: OSError, path: str | os.PathLike[str] | None = None, action: str = "write") -> EnvError:
    """A one-line EnvError for an operating-system failure on `path` (or the path the error names)."""
    where = exc.filename if exc.filename is not None else path
    code = exc.errno
    if code is None:  # pyarrow raises plain OSErrors whose text carries the cause
        text = str(exc)
        code = next((c for c, name in ((errno.ENOSPC, "No space left"), (errno.EROFS, "Read-only file"),
                                       (errno.EACCES, "Permission denied"), (errno.EDQUOT, "quota"),
                                       (errno.EFBIG, "File too large")) if name in text), None)
        if code is None and " requested and " in text and text.endswith(" written"):  # numpy's short write
            code = _short_write_cause()
    why = _FIXES.get(code) if code is not None else None
    if why is None:
        why = (exc.strerror or str(exc) or type(exc).__name__).splitlines()[0][:200]
    return EnvError(f"cannot {action} {where}: {why}" if where is not None else why)


def _short_write_cause() -> int:
    """Why a write was cut short: a file-size limit when one is set (EFBIG), else a full disk."""
    try:
        import resource

        return errno.EFBIG if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY else errno.ENOSPC
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return errno.ENOSPC


def temp_path(target: str | os.PathLike[str], kind: str = "") -> Path:
    """A fresh temporary name beside `target` (same directory, so the final rename is atomic)."""
    t = Path(target)
    return t.parent / f".{t.name}.{kind}{secrets.token_hex(4)}{TMP_SUFFIX}"


def is_temp_name(name: str) -> bool:
    """Whether a file or directory name is one of prefixscan's temporaries (this version's or older)."""
    return name.endswith(TMP_SUFFIX) or name.startswith(_LEGACY_PREFIXES) or (
        name.startswith(".") and name.endswith(".tmp"))  # rundir.write_table's old `.NAME.XXXX.tmp`


def clean_temps(directory: str | os.PathLike[str], only_prefix: str = "", legacy: bool = True) -> list[str]:
    """Remove prefixscan's temporaries in `directory` (call under the run's lock): what a killed run left.
    `legacy` also takes older versions' names (only inside a run directory, where nothing else lives)."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return removed
    for e in entries:
        ours = is_temp_name(e.name) if legacy else e.name.endswith(TMP_SUFFIX)
        if not (ours and e.name.startswith(only_prefix)):
            continue
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path, ignore_errors=True)
        else:
            Path(e.path).unlink(missing_ok=True)
        removed.append(e.name)
    return removed


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename in `path` durable (no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def refuse_existing(target: str | os.PathLike[str], force: bool) -> None:
    """A UsageError when `target` exists and `force` was not given."""
    if not force and os.path.lexists(target):
        raise UsageError(f"{target} already exists; pass --force to replace it")


@contextmanager
def replacing(target: str | os.PathLike[str], force: bool = True, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write; on success it is renamed over `target`, on failure removed.

    With `force` False an existing target is refused before anything is written. `durable` flushes the
    file and the directory entry to disk, so a power loss cannot leave a renamed but empty file."""
    refuse_existing(target, force)
    tmp = temp_path(target)
    try:
        yield tmp
        if durable:
            fsync_file(tmp)
        os.replace(tmp, target)
    except OSError as exc:
        _unlink(tmp)
        raise env_error(exc, target) from None
    except BaseException:
        _unlink(tmp)
        raise
    if durable:
        fsync_dir(Path(target).parent)


@contextmanager
def open_atomic(target: str | os.PathLike[str], mode: str = "wb", force: bool = True,
                **kwargs: Any) -> Iterator[IO[Any]]:
    """`open(target, mode)` whose file appears under its name only once closed without an error."""
    with replacing(target, force) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def write_bytes(target: str | os.PathLike[str], data: bytes, force: bool = True) -> Path:
    """Write `data` to `target` atomically; returns the target."""
    with open_atomic(target, "wb", force) as f:
        f.write(data)
    return Path(target)


def write_text(target: str | os.PathLike[str], text: str, force: bool = True) -> Path:
    """Write UTF-8 `text` to `target` atomically; returns the target."""
    return write_bytes(target, text.encode("utf-8"), force)


def _unlink(p: Path) -> None:
    try:
        p.unlink(missing_ok=True)
    except OSError:
        pass
