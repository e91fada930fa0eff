"""`prefixscan synth`: write a deterministic synthetic request log with a ground-truth sidecar.

Only parses options and calls `prefixscan.synth.write`; the library is imported inside the command so
`prefixscan --help` stays fast.
"""

from __future__ import annotations

import time

import typer

from prefixscan.cli.choices import SYNTH_FORMATS, one_of
from prefixscan.cli.common import handle_errors, json_or_quiet, safe, stderr_console
from prefixscan.report.fmt import say

_FORMAT_HELP = "Output format: jsonl, jsonl.gz, parquet, or mooncake (hashed trace, 512-token blocks)."


def register(app: typer.Typer) -> None:
    """Add the `synth` command to the application."""

    @app.command("synth")
    @handle_errors
    def synth(
        output: str = typer.Option(..., "-o", "--output", help="Output file to write."),
        requests: int = typer.Option(1000, "--requests", "-n", help="Number of requests to generate."),
        seed: int = typer.Option(0, "--seed", help="Random seed; same seed and options give identical files."),
        scenario: list[str] = typer.Option(
            [], "--scenario", "-s",
            help="Scenario, repeatable or comma-separated, optionally weighted (chat=3,rag=1), or 'all'. "
            "Scenarios: chat, shared_prompt, doc_qa, template, rag, agent, viral. Default: all.",
        ),
        tenants: int = typer.Option(3, "--tenants", help="Number of tenants."),
        fmt: str = typer.Option("jsonl", "--format", "-f", metavar=one_of(SYNTH_FORMATS), help=_FORMAT_HELP),
        rps: float = typer.Option(5.0, "--rps", help="Mean request rate (requests per second), bursts included."),
        prompt_tokens: int = typer.Option(
            2000, "--prompt-tokens", help="Approximate size of the shared part of a prompt, in tokens."),
        breakers: str = typer.Option(
            "on", "--breakers",
            help="Dynamic fields to inject: on (timestamp,request_id,user_name), off, all, or a comma list."),
        breaker_rate: float = typer.Option(
            0.3, "--breaker-rate", help="Fraction of prompt sources (system prompts, templates) that inject."),
        drift: str = typer.Option(
            "off", "--drift", help="Normalisation drift / template churn to inject: off, all, or a comma list of "
            "whitespace, line_endings, unicode, json_key_order, tool_order, rag_order, template_churn, list_order."),
        drift_rate: float = typer.Option(0.3, "--drift-rate", help="Fraction of prompt sources that drift."),
        text: str = typer.Option(
            "corpus", "--text", metavar="corpus|fresh",
            help="Where message text comes from: corpus (slices of one fixed corpus: fast, but paragraphs recur "
            "across unrelated messages; the default, so existing logs reproduce) or fresh (new text for every "
            "message: markdown answers, heavy-tailed user turns, JSON tool results; for realistic benchmarks)."),
        truth: str = typer.Option("", "--truth", help="Ground-truth sidecar path (default: OUTPUT.truth.jsonl)."),
        no_truth: bool = typer.Option(False, "--no-truth", help="Do not write the ground-truth sidecar."),
        force: bool = typer.Option(False, "--force", help="Replace an existing output or ground-truth file."),
        start: str = typer.Option("2026-11-29T10:00:00Z", "--start", help="Time of the first arrival window (UTC)."),
        id_prefix: str = typer.Option("", "--id-prefix",
                                      help="Prefix for request and conversation ids (to analyse several logs "
                                           "together)."),
        model: str = typer.Option("llama-3.1-8b-instruct", "--model", help="Model name written in every record."),
        users: int = typer.Option(200, "--users-per-tenant", help="Distinct end users per tenant."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing on success."),
    ) -> None:
        """Generate a realistic synthetic request log with ground truth (for demos, tests, benchmarks).

        An existing output or ground-truth file is refused (exit 2) unless --force.
        """
        from prefixscan.errors import UsageError
        from prefixscan.synth import FORMATS, SynthConfig, parse_breakers, parse_scenarios, write
        from prefixscan.synth.config import parse_drift

        if fmt not in FORMATS:
            raise UsageError(f"unknown --format {fmt!r}; choose from: {', '.join(FORMATS)}")
        config = SynthConfig(
            requests=requests, seed=seed, scenarios=parse_scenarios(scenario), tenants=tenants, rps=rps,
            prompt_tokens=prompt_tokens, breakers=parse_breakers(breakers), breaker_rate=breaker_rate,
            start=start, id_prefix=id_prefix, model=model, users_per_tenant=users,
            drift=parse_drift(drift), drift_rate=drift_rate, text=text,
        )
        began = time.perf_counter()
        try:
            result = write(config, output, fmt, None if no_truth else truth, force=force)
        except OSError as exc:
            raise UsageError(f"cannot write {exc.filename or output}: {exc.strerror or exc}") from None
        elapsed = time.perf_counter() - began
        if json_or_quiet(as_json, quiet, result.to_dict()):
            return
        console = stderr_console()
        mix = ", ".join(f"{k} {v}" for k, v in sorted(result.by_scenario.items()))
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(result.fields_by_kind.items())) or "none"
        say(console, f"wrote {result.requests:,} requests ({result.conversations:,} conversations) to "
                     f"{safe(result.path)} ({result.format}, {result.bytes:,} bytes) in {elapsed:.2f}s")
        say(console, f"  scenarios: {safe(mix)}")
        say(console, f"  tenants: {len(result.by_tenant)}; dynamic fields: {result.fields:,} ({safe(kinds)})")
        say(console, f"  ideal-cache block hit rate (estimated 512-token blocks): {result.block_hit_rate:.3f}")
        if result.truth_path:
            say(console, f"  ground truth: {safe(result.truth_path)}")
