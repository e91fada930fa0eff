"""Helpers shared by command modules: error mapping and console handles."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import typer

from prefixscan.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EnvError, PrefixscanError, RunDirError
from prefixscan.report.escape import clean, safe

__all__ = ["fail", "handle_errors", "json_or_quiet", "safe", "show_progress", "stderr_console", "stdout_console"]

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(func: F) -> F:
    """Turn every failure into one line on stderr and its class's exit code (prefixscan/errors.py):
    expected errors print their message; operating-system errors name the path and the fix; anything
    else is a bug, reported in one line (PREFIXSCAN_TRACEBACK=1 shows the traceback)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with _sigterm_interrupts():
                return func(*args, **kwargs)
        except PrefixscanError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted (every file is written whole or not at all; re-run the command)", EXIT_INTERRUPTED)
        except OSError as exc:
            from prefixscan.run.atomic import env_error

            err = env_error(exc, action="use")
            fail(str(err), err.exit_code)
        except MemoryError:
            fail("out of memory; pass --stream (analyze) or run on a larger machine", EnvError.exit_code)
        except Exception as exc:  # a bug: one line, the traceback on request
            origin = type(exc).__module__.split(".")[0]
            if origin in ("typer", "click") or os.environ.get("PREFIXSCAN_TRACEBACK"):
                raise  # the command line's own errors (bad parameter, exit): one line from cli/usage.py
            if origin == "pyarrow" and "arquet" in str(exc):  # a table read outside rundir's checks
                fail(f"a Parquet file is damaged or unreadable: {str(exc).splitlines()[0][:200]}; if it belongs to "
                     "a run directory, re-create the run with `prefixscan analyze LOGS -o RUN --force`",
                     RunDirError.exit_code)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            fail(f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''} "
                 f"(at {os.path.basename(where.filename)}:{where.lineno}); this is a bug: please report it "
                 "(PREFIXSCAN_TRACEBACK=1 shows the traceback)", EXIT_INTERNAL)

    return wrapper  # type: ignore[return-value]


def fail(message: str, code: int) -> NoReturn:
    """Print `message` as one line on stderr and exit with `code`."""
    typer.echo(f"prefixscan: error: {' '.join(clean(message).split())}", err=True)  # messages echo paths and names
    raise typer.Exit(code) from None


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so temporaries are removed and workers stopped."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stderr_console(quiet: bool = False):  # rich is imported lazily
    """A rich console on stderr for progress and summaries that must not pollute --json stdout."""
    from rich.console import Console

    return Console(stderr=True, quiet=quiet, width=_width(sys.stderr), emoji=False)


def stdout_console():
    from rich.console import Console

    return Console(file=sys.stdout, width=_width(sys.stdout), emoji=False)


def _width(stream: Any) -> int | None:
    """The terminal's width (Rich reads it, or $COLUMNS); 120 columns when the output is not a terminal
    and $COLUMNS is not set. Emoji codes are off in every console: `:name:` in data stays text."""
    return None if stream.isatty() or os.environ.get("COLUMNS", "").isdigit() else 120


def json_or_quiet(json_out: bool, quiet: bool, data: Any, **dumps: Any) -> bool:
    """With --json, print `data` as JSON on stdout: nothing else may go there. True when the command prints
    nothing more (--json or --quiet)."""
    if json_out:
        import json

        typer.echo(json.dumps(data, indent=2, **dumps))
    return json_out or quiet


def show_progress(quiet: bool) -> bool:
    """Progress bars only on an interactive stderr and without --quiet."""
    return not quiet and sys.stderr.isatty()


def with_project_config(command: str, func: F, scenario_keys: Callable[[], set[str]]) -> F:
    """Fill options left at their defaults from prefixscan.toml (prefixscan.read.projectconfig), then run.

    analyze records the settings it used in the run, so later commands on that run find them again.
    """

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        from prefixscan.read import projectconfig as pc

        ctx = kwargs.pop(CTX)

        def run() -> Any:
            explicit = (ctx.find_root().obj or {}).get("config")
            cfg = pc.locate(command, explicit, kwargs)
            if cfg is not None:
                pc.check_scenario(cfg, scenario_keys())
                defaulted = {n for n in kwargs if is_default(ctx, n)}
                used = pc.apply(command, cfg, kwargs, defaulted, _hints(func))
                if used and (not kwargs.get("quiet") or not cfg.explicit):  # a found file: said even with -q
                    typer.echo(f"prefixscan: {clean(pc.describe(cfg, used, kwargs))}", err=True)
            result = func(**kwargs)
            if cfg is not None and command == "analyze" and kwargs.get("output"):
                from prefixscan.run.rundir import add_tables

                add_tables(kwargs["output"], {}, "project_config", cfg.to_json())
            return result

        return handle_errors(run)()

    # typer passes the click context to a parameter annotated typer.Context: add one to what it sees
    sig = inspect.signature(func)
    ctx_param = inspect.Parameter(CTX, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    wrapper.__signature__ = sig.replace(parameters=[ctx_param, *sig.parameters.values()])  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


CTX = "_prefixscan_ctx"


def _hints(func: Callable[..., Any]) -> dict[str, Any]:
    """The command's parameter types (for checking config values); none when they cannot be resolved."""
    import typing

    try:
        return typing.get_type_hints(func)
    except (NameError, TypeError):
        return {}


def is_default(ctx: Any, name: str) -> bool:
    """The user did not give this option (typer may bundle its own click: compare the source by name)."""
    src = ctx.get_parameter_source(name)
    return src is None or src.name in ("DEFAULT", "DEFAULT_MAP")
