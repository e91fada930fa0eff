"""Fixed per-process costs a command can avoid (docs/bench.md, "Start-up").

- `skip_pandas_probe`: pyarrow imports pandas, when it is installed (Ray brings it), the first time it
  converts a numpy array (`pa.array`) and when `pyarrow.dataset` loads: ~0.35 s, although analyze never
  hands pyarrow a pandas object. Run both once with pandas hidden: pyarrow then treats numpy arrays and
  lists as it does without pandas (the same arrays), and pandas stays importable: pyarrow's own pandas
  functions (`to_pandas`, `from_pandas`) import it when called. Only the CLI does this: in a library
  caller's process, its own `pa.array(series)` would no longer be recognised as pandas.

- `hold`: the console command ends with `os._exit` (cli/app.py); what a finished run held (memos, columns:
  millions of objects) is kept referenced instead of being freed one by one as the run's frames return.
  Only `keep_until_exit` (the console command) turns it on: a library caller's objects are freed as usual.

numba's typing and target contexts (built at the first compiled call) are not built in a thread at start-up:
numba's registries are not thread-safe ("generator already executing" when the main thread reaches a kernel).
Importing the later stages in a thread while the main thread reads was measured too: the thread took
most of the GIL from the busy main thread and the run was no faster (docs/bench.md, "Start-up").
"""

from __future__ import annotations

import sys
from typing import TypeVar

T = TypeVar("T")

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


def let_go() -> None:
    """Free what `hold` kept: a command that runs a second analysis (`fix`) frees the first one's memos
    before it, so its peak memory is one run's, as without `hold`."""
    if _held:
        _held.clear()
