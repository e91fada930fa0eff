"""Errors prefixscan raises on purpose.

Every error carries a message that says what was wrong, where, and what to do; the CLI maps each class
to an exit code and prints the message on one line, never a traceback.
"""

from __future__ import annotations


class PrefixscanError(Exception):
    """Base class: an expected failure with a user-facing message."""

    exit_code = 1


class UsageError(PrefixscanError):
    """The command line or configuration asks for something impossible."""

    exit_code = 2


class InputError(PrefixscanError):
    """An input file is missing, unreadable, or of an unknown shape."""

    exit_code = 3


class RejectError(PrefixscanError):
    """A malformed record met under `--strict`."""

    exit_code = 4


class RunDirError(PrefixscanError):
    """A run directory is missing, incomplete, or would be overwritten."""

    exit_code = 5


class TokenizerError(PrefixscanError):
    """A tokenizer could not be loaded or used."""

    exit_code = 6
