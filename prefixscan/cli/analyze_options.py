"""`analyze`'s option groups (cli/groups.py): who may see names and text, and how the work is spread.

Each option names the AnalyzeConfig field it sets (`to`, where the flag's name differs), so the command
builds its config from the groups without repeating them.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixscan.cli.groups import opt


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
