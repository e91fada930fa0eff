"""What `analyze --engine ray` needs before anything is read: Ray importable, block granularity.

The options check (`pipeline/config.validate`) runs it before the pipeline starts, and the Ray encode stage
asks for the `ray` module through `require_ray`; both sit above this module, which imports neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefixscan.errors import EnvError, UsageError

if TYPE_CHECKING:
    from prefixscan.config import AnalyzeConfig


def require_ray() -> Any:
    """The `ray` module, or an EnvError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise EnvError("--engine ray needs Ray: pip install 'prefixscan[ray]'") from None
    return ray


def check(cfg: AnalyzeConfig) -> None:
    """Options the Ray engine cannot honour, as usage errors; Ray itself must be importable."""
    if cfg.granularity != "block":
        raise UsageError("--engine ray measures block granularity; drop --granularity token")
    require_ray()
