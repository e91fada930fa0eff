"""`prefixscan simulate LOGS...`: the analyze options a log needs before it can be replayed.

A log is analysed first (into -o RUN_DIR, or a temporary run removed afterwards) with the options that
decide its requests table: tokenizer, block size, record shape and field mapping, hashing, conversation
inference. Given a run directory instead, those options are refused: the run was analysed already, and
its manifest says how.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from prefixscan.cli.choices import GRANULARITIES, ORDERS, RECORD_FORMATS, one_of
from prefixscan.cli.groups import config_fields, flag, opt
from prefixscan.errors import UsageError


def _fields(values: list[str]) -> tuple[tuple[str, str], ...] | None:
    from prefixscan.cli.analyze import _parse_fields

    return _parse_fields(values) or None


def _lora_paths(values: list[str]) -> tuple[tuple[str, str], ...] | None:
    from prefixscan.cli.analyze import _parse_lora_paths

    return _parse_lora_paths(values) or None


@dataclass(frozen=True)
class LogOptions:
    """The analyze options for LOGS given to simulate (refused with a run directory); each sets the
    AnalyzeConfig field `to` (None: not given, so analyze's own default and prefixscan.toml apply)."""

    fmt: str | None = opt(None, "--format", metavar=one_of(RECORD_FORMATS), to="format",
                          help="Logs: record shape (default auto).")
    order: str | None = opt(None, "--order", metavar=one_of(ORDERS), help="Logs: time or input order.")
    field: list[str] = opt([], "--field", metavar="NAME=PATH", to="fields", convert=_fields,
                           help="Logs: map a field (repeatable).")
    tokenizer: str | None = opt(None, "--tokenizer",
                                help="Logs: tiktoken:<encoding>, hf:<local dir or hub id>, or none.")
    block_size: int | None = opt(None, "--block-size", help="Logs: KV block size in tokens (default 16).")
    hash_block_size: int | None = opt(None, "--hash-block-size", help="Logs: block size of hashed traces.")
    granularity: str | None = opt(None, "--granularity", metavar=one_of(GRANULARITIES),
                                  help="Logs: block (vLLM) or token (SGLang page size 1).")
    hash_algo: str | None = opt(None, "--hash", to="hash", help="Logs: block hash values (xxh3 or vllm:ALGO).")
    hash_seed: str | None = opt(None, "--hash-seed", help="Logs: PYTHONHASHSEED for --hash vllm:*.")
    lora_path: list[str] = opt([], "--lora-path", to="lora_paths", convert=_lora_paths,
                               help="Logs: NAME=PATH of a LoRA adapter.")
    strict: bool = opt(False, "--strict", convert=lambda on: True if on else None,
                       help="Logs: stop at the first malformed record.")
    no_infer_conversations: bool = opt(False, "--no-infer-conversations", to="infer_conversations",
                                       convert=lambda off: False if off else None,
                                       help="Logs: do not infer conversations from message prefixes.")

    def analyze_options(self) -> dict[str, Any]:
        """The analyze options given on the command line (AnalyzeConfig names); absent ones are left out so
        analyze's own defaults (and prefixscan.toml) apply."""
        return {k: v for k, v in config_fields(self).items() if v is not None}

    @staticmethod
    def flag_of(config_field: str) -> str:
        """The simulate flag that sets an AnalyzeConfig field (for the error on a run directory)."""
        return next(flag(f) for f in fields(LogOptions) if (f.metadata["to"] or f.name) == config_field)


def is_run(inputs: list[str]) -> bool:
    return len(inputs) == 1 and (Path(inputs[0]) / "manifest.json").exists()


def refuse_on_run(run: str, options: dict[str, Any]) -> None:
    """Analyze options with a run directory: a one-line error naming them and the run's own settings."""
    if not options:
        return
    from prefixscan.run.load import read_manifest

    cfg = read_manifest(run).get("config", {})
    given = ", ".join(LogOptions.flag_of(k) for k in options)
    had = f"tokenizer {cfg.get('tokenizer')}, block size {cfg.get('block_size')}"
    raise UsageError(f"options for logs ({given}) given with a run directory: {run} was analysed already "
                     f"({had}); re-run `prefixscan analyze` with them, or pass the logs to simulate")


def analyze_first(inputs: list[str], output: str | None, force: bool, quiet: bool, console: Any,
                  options: dict[str, Any]) -> tuple[str, str | None]:
    """Logs given instead of a run: analyse them into -o (or a temporary run that is removed after)."""
    import prefixscan

    tmp = None
    target = output
    if target is None:
        tmp = tempfile.mkdtemp(prefix="prefixscan-sim-")
        target = str(Path(tmp) / "run")
        if not quiet:
            console.print("analysing the logs first (pass -o RUN_DIR to keep the run and the sim tables)")
    prefixscan.analyze(*inputs, output=target, force=force, quiet=True, **options)
    return target, tmp
