"""One writer per run directory: a lock file beside it, held with an OS lock for the writer's lifetime.

The lock is `.<run name>.lock` in the run's parent directory (a new run does not exist yet, and a `--force`
run swaps the whole directory). The kernel's `flock` is released when the holder dies, however it dies, so
a lock left by a killed run is simply taken over; the file names the holder's pid for the message the
next writer prints while the holder is alive.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefixscan.errors import RunLockedError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: O_EXCL files with pid liveness instead
    fcntl = None  # type: ignore[assignment]


_HELD: dict[str, list[int]] = {}  # lock path -> [fd, depth] of the locks this process holds


def lock_path(run: str | os.PathLike[str]) -> Path:
    """Where the lock of run directory `run` lives."""
    r = Path(os.path.abspath(run))
    return r.parent / f".{r.name}.lock"


class RunLock:
    """Exclusive writer lock of one run directory; a context manager. Refuses at once (no waiting): two
    runs writing the same directory is a mistake to report, not a queue to form."""

    def __init__(self, run: str | os.PathLike[str]) -> None:
        self.run = Path(run)
        self.path = lock_path(run)
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock, or raise RunLockedError naming the holder (re-entrant within one process)."""
        from prefixscan.run.atomic import env_error

        held = _HELD.get(str(self.path))
        if held is not None:
            held[1] += 1
            self._fd = held[0]
            return self
        for _ in range(20):  # the holder may remove the file between our open and our lock: retry
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise env_error(exc, self.path) from None
            if not self._try_lock(fd):
                holder = _read_pid(fd)
                os.close(fd)
                raise RunLockedError(
                    f"run directory {self.run} is in use: another prefixscan (pid {holder or '?'}, lock "
                    f"{self.path}) is writing it; wait for it to finish or write to another -o")
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # we locked a file the last holder had already removed
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd
            _HELD[str(self.path)] = [fd, 1]
            return self
        raise RunLockedError(f"could not take the lock {self.path}; another prefixscan keeps replacing it")

    @staticmethod
    def _try_lock(fd: int) -> bool:
        if fcntl is None:  # pragma: no cover
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        held = _HELD.get(str(self.path))
        if held is not None and held[1] > 1:
            held[1] -= 1
            self._fd = None
            return
        _HELD.pop(str(self.path), None)
        try:
            self.path.unlink(missing_ok=True)  # while still holding it: a waiter re-checks the inode
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
