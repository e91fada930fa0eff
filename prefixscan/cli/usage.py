"""How the command line shows help and usage errors (one home for both, used by every command).

Help is click's plain layout, not Rich's panels: Rich's option table cut long flag names to fit 80
columns (`--decode-slowdo…`), where the plain layout puts a long name on a line of its own. Text is
wrapped at spaces only, so a flag, a model id or a path in the help is never split at a hyphen or cut.

A usage error (unknown option, missing argument, bad choice or number) is one line on stderr, like every
other error: `prefixscan: error: <message> (see prefixscan COMMAND --help)`, exit 2.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import Any

import typer
from typer import _click  # typer's own copy of click, which its commands are built on
from typer.core import TyperCommand, TyperGroup

from prefixscan.errors import UsageError

HELP_WIDTH = 100  # help lines never exceed the terminal (80 in a pipe) nor this


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """`text` wrapped to `width` columns at spaces only (never inside a word), paragraphs kept apart by a
    blank line, a line starting "Example:" kept on a line of its own; a paragraph starting with click's `\\b`
    marker keeps its lines as written."""
    lines: list[str] = []
    for para in re.split(r"\n[ \t]*\n", text.strip("\n")):
        if lines:
            lines.append("")
        if para.startswith("\b"):
            lines.extend(indent + line for line in para[1:].strip("\n").splitlines())
            continue
        for piece in re.split(r"\n(?=\s*Examples?:)", para):  # an example starts a line of its own
            words = " ".join(piece.split())
            lines.extend(textwrap.wrap(words, max(width, 1), initial_indent=indent, subsequent_indent=indent,
                                       break_long_words=False, break_on_hyphens=False) or [indent])
    return lines


class HelpFormatter(_click.HelpFormatter):
    """click's help layout with text wrapped at spaces only (`wrap`)."""

    def write_text(self, text: str) -> None:
        self.write("\n".join(wrap(text, self.width, " " * self.current_indent)) + "\n")

    def write_dl(self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        """Terms (flag names) whole in the first column; one too wide for it gets a line of its own, and its
        help starts on the next line."""
        rows = list(rows)
        col_max = min(col_max, self.width // 3)  # a narrow terminal keeps room for the help text
        first = min(max((len(term) for term, _ in rows), default=0), col_max) + col_spacing
        pad = " " * (self.current_indent + first)
        for term, text in rows:
            self.write(" " * self.current_indent + term)
            if not text:
                self.write("\n")
                continue
            lines = wrap(text, max(self.width - self.current_indent - first, 20))
            self.write(" " * (first - len(term)) if len(term) <= first - col_spacing else "\n" + pad)
            self.write(lines[0] + "\n" + "".join(f"{pad}{line}\n" if line else "\n" for line in lines[1:]))


class Context(typer.Context):
    """A context whose help uses `HelpFormatter`."""

    formatter_class = HelpFormatter


class Command(TyperCommand):
    """Every prefixscan command: plain help (`HelpFormatter`)."""

    context_class = Context


class Group(TyperGroup):
    """The `prefixscan` application: plain help, and usage errors in one line (`usage_error`)."""

    context_class = Context

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _click.exceptions.UsageError as exc:
            usage_error(exc)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _click.exceptions.UsageError as exc:
            usage_error(exc)


def usage_error(exc: Any) -> None:
    """Print a command-line error as one line naming the command's help, and exit 2. `--help`-like errors
    (a command given no arguments prints its help) are left to click."""
    from prefixscan.cli.common import fail

    if isinstance(exc, _click.exceptions.NoArgsIsHelpError):
        raise exc
    ctx = exc.ctx
    command = f"{ctx.info_name} " if ctx is not None and ctx.parent is not None and ctx.info_name else ""
    message = " ".join(exc.format_message().split()).rstrip(".")
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    fail(f"{message} (see prefixscan {command}--help)", UsageError.exit_code)
