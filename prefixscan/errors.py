"""Errors prefixscan raises on purpose.

Every error carries a message that says what was wrong, where, and what to do; the CLI maps each class
to an exit code and prints the message on one line, never a traceback. The exit codes (docs/analyze.md):

    0  success            1  internal error (a bug: please report it)
    2  usage              3  input (unreadable input, or no record accepted)
    4  a reject under --strict                  5  run directory (missing, damaged, in use, would be lost)
    6  tokenizer          7  environment (disk full, read-only file system, permission denied)
    8  a check failed (`prefixscan check`: a gate failed, or could not be checked)
  130  interrupted (Ctrl-C or SIGTERM)
"""

from __future__ import annotations

from typing import Any


class PrefixscanError(Exception):
    """Base class: an expected failure with a user-facing message."""

    exit_code = 1


class UsageError(PrefixscanError):
    """The command line or configuration asks for something impossible."""

    exit_code = 2


class InputError(PrefixscanError):
    """An input file is missing, unreadable, or of an unknown shape."""

    exit_code = 3


class NothingAcceptedError(InputError):
    """Every record read was rejected (or there was none): there is nothing to measure. `result` is the
    run that measured nothing (its rejects), for a caller of `prefixscan.analyze()` that wants them."""

    result: Any = None  # a pipeline.run.AnalysisResult (errors.py sits under every layer: not imported here)


class RejectError(PrefixscanError):
    """A malformed record met under `--strict`."""

    exit_code = 4


class RunDirError(PrefixscanError):
    """A run directory is missing, incomplete, or would be overwritten."""

    exit_code = 5


class RunLockedError(RunDirError):
    """Another prefixscan process is writing the same run directory."""


class TokenizerError(PrefixscanError):
    """A tokenizer could not be loaded or used."""

    exit_code = 6


class EnvError(PrefixscanError):
    """The machine refused: disk full, read-only file system, permission denied, too many open files."""

    exit_code = 7


EXIT_CHECK_FAILED = 8  # not an error: `check` ran and a gate did not hold (or could not be evaluated)
EXIT_INTERRUPTED = 130
EXIT_INTERNAL = 1
