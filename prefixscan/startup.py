"""Fixed per-process costs a command can avoid or overlap (docs/bench.md, "Start-up").

- `skip_pandas_probe`: pyarrow imports pandas, when it is installed (Ray brings it), the first time it
  converts a numpy array (`pa.array`) and when `pyarrow.dataset` loads: ~0.35 s, although analyze never
  hands pyarrow a pandas object. Run both once with pandas hidden: pyarrow then treats numpy arrays and
  lists as it does without pandas (the same arrays), and pandas stays importable: pyarrow's own pandas
  functions (`to_pandas`, `from_pandas`) import it when called. Only the CLI does this: in a library
  caller's process, its own `pa.array(series)` would no longer be recognised as pandas.
- `warm_numba`: numba's first compiled call (even one loaded from its cache) builds its typing and target
  contexts, ~0.3 s of Python. Doing that in a thread at start-up overlaps it with the time the main thread
  waits for files, the tokenizer's Rust code and the encode workers. numba's compiler lock serialises it
  with any compile the main thread starts, so the kernels and their results are the same.
"""

from __future__ import annotations

import sys
import threading


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


def warm_numba() -> threading.Thread:
    """Build numba's typing and target contexts in a daemon thread; returns it (join it in tests)."""
    thread = threading.Thread(target=_refresh_numba, name="prefixscan-numba-warmup", daemon=True)
    thread.start()
    return thread


def _refresh_numba() -> None:
    from numba.core.registry import cpu_target

    cpu_target.target_context.refresh()
    cpu_target.typing_context.refresh()
