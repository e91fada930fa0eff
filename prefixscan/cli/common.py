"""Helpers shared by command modules: error mapping and console handles."""

from __future__ import annotations

import functools
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
