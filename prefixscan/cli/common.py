"""Helpers shared by command modules: error mapping and console handles."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from prefixscan.errors import PrefixscanError

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(func: F) -> F:
    """Turn expected errors into a one-line message on stderr and the error's exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except PrefixscanError as exc:
            typer.echo(f"prefixscan: error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("prefixscan: interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def stderr_console(quiet: bool = False):  # noqa: ANN201 - rich is imported lazily
    """A rich console on stderr for progress and summaries that must not pollute --json stdout."""
    from rich.console import Console

    return Console(stderr=True, quiet=quiet, width=None if sys.stderr.isatty() else 120)


def stdout_console():  # noqa: ANN201
    from rich.console import Console

    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 120)


def show_progress(quiet: bool) -> bool:
    """Progress bars only on an interactive stderr and without --quiet."""
    return not quiet and sys.stderr.isatty()


def with_project_config(command: str, func: F, scenario_keys: Callable[[], set[str]]) -> F:
    """Fill options left at their defaults from prefixscan.toml (prefixscan.projectconfig), then run.

    analyze records the settings it used in the run, so later commands on that run find them again.
    """

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        from prefixscan import projectconfig as pc

        ctx = kwargs.pop(CTX)

        def run() -> Any:
            explicit = (ctx.find_root().obj or {}).get("config")
            cfg = pc.locate(command, explicit, kwargs)
            if cfg is not None:
                pc.check_scenario(cfg, scenario_keys())
                defaulted = {n for n in kwargs if _defaulted(ctx, n)}
                used = pc.apply(command, cfg, kwargs, defaulted)
                if used and not kwargs.get("quiet"):
                    typer.echo(f"prefixscan: config {cfg.path}: {', '.join(used)}", err=True)
            result = func(**kwargs)
            if cfg is not None and command == "analyze" and kwargs.get("output"):
                from prefixscan.io.rundir import add_tables

                add_tables(kwargs["output"], {}, "project_config", cfg.to_json())
            return result

        return handle_errors(run)()

    # typer passes the click context to a parameter annotated typer.Context: add one to what it sees
    sig = inspect.signature(func)
    ctx_param = inspect.Parameter(CTX, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    wrapper.__signature__ = sig.replace(parameters=[ctx_param, *sig.parameters.values()])  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


CTX = "_prefixscan_ctx"


def _defaulted(ctx: Any, name: str) -> bool:
    """The user did not give this option (typer may bundle its own click: compare the source by name)."""
    src = ctx.get_parameter_source(name)
    return src is None or src.name in ("DEFAULT", "DEFAULT_MAP")
