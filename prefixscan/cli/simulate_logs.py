"""`prefixscan simulate LOGS...`: the analyze options a log needs before it can be replayed.

A log is analysed first (into -o RUN_DIR, or a temporary run removed afterwards) with the options that
decide its requests table: tokenizer, block size, record shape and field mapping, hashing, conversation
inference. Given a run directory instead, those options are refused: the run was analysed already, and
its manifest says how.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prefixscan.errors import UsageError

FLAGS = {  # AnalyzeConfig field -> the simulate flag that sets it (for the error on a run directory)
    "format": "--format", "order": "--order", "fields": "--field", "tokenizer": "--tokenizer",
    "block_size": "--block-size", "hash_block_size": "--hash-block-size", "granularity": "--granularity",
    "hash": "--hash", "hash_seed": "--hash-seed", "lora_paths": "--lora-path", "strict": "--strict",
    "infer_conversations": "--no-infer-conversations",
}


def analyze_options(
    fmt: str | None, order: str | None, field: list[str], tokenizer: str | None, block_size: int | None,
    hash_block_size: int | None, granularity: str | None, hash_algo: str | None, hash_seed: str | None,
    lora_path: list[str], strict: bool, no_infer_conversations: bool,
) -> dict[str, Any]:
    """The analyze options given on the command line (AnalyzeConfig names); absent ones are left out so
    analyze's own defaults (and prefixscan.toml) apply."""
    from prefixscan.cli.analyze import _parse_fields, _parse_lora_paths

    opts: dict[str, Any] = {
        "format": fmt, "order": order, "fields": _parse_fields(field) or None, "tokenizer": tokenizer,
        "block_size": block_size, "hash_block_size": hash_block_size, "granularity": granularity,
        "hash": hash_algo, "hash_seed": hash_seed, "lora_paths": _parse_lora_paths(lora_path) or None,
        "strict": True if strict else None, "infer_conversations": False if no_infer_conversations else None,
    }
    return {k: v for k, v in opts.items() if v is not None}


def is_run(inputs: list[str]) -> bool:
    return len(inputs) == 1 and (Path(inputs[0]) / "manifest.json").exists()


def refuse_on_run(run: str, options: dict[str, Any]) -> None:
    """Analyze options with a run directory: a one-line error naming them and the run's own settings."""
    if not options:
        return
    from prefixscan.io.run import read_manifest

    cfg = read_manifest(run).get("config", {})
    given = ", ".join(FLAGS[k] for k in options)
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
