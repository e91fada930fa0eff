"""Fixed per-process costs a command can avoid (docs/bench.md, "Start-up").

- `skip_pandas_probe`: pyarrow imports pandas, when it is installed (Ray brings it), the first time it
  converts a numpy array (`pa.array`) and when `pyarrow.dataset` loads: ~0.35 s, although analyze never
  hands pyarrow a pandas object. Run both once with pandas hidden: pyarrow then treats numpy arrays and
  lists as it does without pandas (the same arrays), and pandas stays importable: pyarrow's own pandas
  functions (`to_pandas`, `from_pandas`) import it when called. Only the CLI does this: in a library
  caller's process, its own `pa.array(series)` would no longer be recognised as pandas.

- `in_background`: a run with encode workers imports what it needs after its encode stage (polars, numba,
  the reuse, aggregate and findings stages) in a thread, while the main thread reads and hands records to
  the workers; the thread mostly runs while the main thread waits for them. `imported()` waits for it:
  call it before this thread imports or uses those modules (two threads importing one package at once
  can each hold a module the other needs).
- `hold`: the console command ends with `os._exit` (cli/app.py); what a finished run held (memos, columns:
  millions of objects) is kept referenced instead of being freed one by one as the run's frames return.
  Only `keep_until_exit` (the console command) turns it on: a library caller's objects are freed as usual.

numba's registries are not thread-safe ("generator already executing" when one thread reaches a kernel
while another builds numba's typing and target contexts): the background job may build them (the run's
does) only because no other thread calls a compiled function until `imported()` has returned.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_loading: threading.Thread | None = None
_held: list[object] | None = None


def skip_pandas_probe() -> None:
    """Let pyarrow's one-time pandas probes find no pandas, unless pandas is already imported."""
    if "pandas" in sys.modules:
        return
    import numpy as np
    import pyarrow as pa

    hide = _Hidden("pandas")
    sys.meta_path.insert(0, hide)
    try:
        pa.array(np.zeros(1, np.int64))  # the conversion probe runs here, once per process
        import pyarrow.dataset  # noqa: F401 - and the dataset module's, when it loads
    finally:
        sys.meta_path.remove(hide)


class _Hidden:
    """A meta-path finder under which one top-level package cannot be imported."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname.partition(".")[0] == self.name:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


def in_background(job: Callable[[], object]) -> None:
    """Run `job` (imports) in a daemon thread; one at a time (a second call while one runs does nothing).
    What fails there is left for the main thread's own import to raise where the module is used."""
    global _loading
    if _loading is not None:
        return

    def run() -> None:
        try:
            job()
        except Exception:  # raised again by the main thread's own import, if it needs the module
            pass

    _loading = threading.Thread(target=run, name="prefixscan-imports", daemon=True)
    _loading.start()


def imported() -> None:
    """Wait for `in_background`'s thread to end (at once when none runs)."""
    global _loading
    thread, _loading = _loading, None
    if thread is not None:
        thread.join()


def keep_until_exit() -> None:
    """From now on, `hold` keeps what it is given referenced until the process ends (the console command,
    which ends with `os._exit`)."""
    global _held
    if _held is None:
        _held = []


def hold(obj: T) -> T:
    """`obj`, kept referenced to the end of the process when `keep_until_exit` was called; otherwise nothing
    is kept."""
    if _held is not None:
        _held.append(obj)
    return obj
