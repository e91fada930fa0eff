"""`prefixscan simulate`'s option groups (prefixscan.cli.groups), each option declared once with the
SimConfig field it sets: the replay (fleet, engine, router, time) and the KV tiers below the GPU with
prefill/decode disaggregation; and the analyze options a log given to simulate needs (`LogOptions`).
Options whose value needs more than one field (--kv-blocks, the replica events, the rate) are converted by
the functions below; the defaults that follow from other options (the router's knowledge, a timing
profile's values) are SimConfig.from_options's."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from prefixscan.cli.choices import (
    DTYPES,
    EVICTIONS,
    GRANULARITIES,
    KNOWLEDGE,
    ORDERS,
    POLICIES,
    PREFILL_MODELS,
    RECORD_FORMATS,
    gpu_names,
    model_names,
    one_of,
)
from prefixscan.cli.groups import config_fields, flag, opt, pairs
from prefixscan.errors import UsageError


def _split_pair(text: str, flag: str) -> tuple[float, int]:
    t, sep, r = text.partition(":")
    try:
        return float(t), int(r) if sep else -1
    except ValueError:
        raise UsageError(f"{flag} expects TIME_S:REPLICA (e.g. 600:2), got {text!r}") from None


def parse_events(restart: list[str], add: list[str], remove: list[str]) -> tuple[Any, ...]:
    """--restart T:R, --add-replica T, --remove-replica T:R -> ReplicaEvent tuple (sorted by time)."""
    from prefixscan.sim.config import ReplicaEvent

    evs = []
    for action, option, texts in (("restart", "--restart", restart), ("add", "--add-replica", add),
                                  ("remove", "--remove-replica", remove)):
        for text in texts:
            t, r = _split_pair(text, option)
            if action == "add":
                evs.append(ReplicaEvent(t, "add"))  # a replica number after the time is ignored
            elif r < 0:
                raise UsageError(f"{option} needs a replica: TIME_S:REPLICA, got {text!r}")
            else:
                evs.append(ReplicaEvent(t, action, r))
    return tuple(sorted(evs, key=lambda e: (e.time_s, e.action, e.replica)))


def parse_params(values: list[str]) -> tuple[tuple[str, str, str], ...]:
    """--param chwbl.c=1.5 -> (("chwbl", "c", "1.5"),)."""
    out = []
    for v in values:
        key, sep, value = v.partition("=")
        pol, dot, name = key.partition(".")
        if not sep or not dot or not pol or not name:
            raise UsageError(f"--param expects POLICY.NAME=VALUE (e.g. chwbl.c=1.5), got {v!r}")
        out.append((pol.strip(), name.strip(), value.strip()))
    return tuple(out)


def _blocks(text: str, flag: str) -> int | None:
    """A block count, or None for 'unbounded'."""
    if text.strip().lower() in ("unbounded", "inf", "infinite"):
        return None
    try:
        return int(float(text))
    except ValueError:
        raise UsageError(f"{flag} expects a block count or 'unbounded', got {text!r}") from None


def parse_kv_blocks(text: str | None) -> tuple[int | None, bool]:
    """--kv-blocks: (blocks, unbounded)."""
    blocks = None if text is None else _blocks(text, "--kv-blocks")
    return blocks, text is not None and blocks is None


def _tier_blocks(flag: str) -> Any:
    """A tier's size option: 0 when absent (no tier), -1 when unbounded."""
    def convert(text: str | None) -> int:
        blocks = 0 if text is None else _blocks(text, flag)
        return -1 if blocks is None else blocks

    return convert


def _ms_to_s(ms: float) -> float:
    return ms / 1000.0


def parse_coeffs(text: str | None) -> tuple[float, ...] | None:
    """--prefill-coeffs a,b,c,d,e -> the numbers (None: not given)."""
    if not text:
        return None
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--prefill-coeffs expects numbers a,b,c,d,e, got {text!r}") from None


_SEVERAL = frozenset({"kv_blocks", "restart", "add_replica", "remove_replica", "rps", "target_rps"})


@dataclass(frozen=True)
class ReplayOptions:
    """The fleet, its engines and router, and the replay's clock."""

    replicas: int = opt(8, "--replicas", "-n", help="Engine replicas.")
    policies: str = opt("all", "--policies", "-p", metavar="all|POLICY,...", convert=lambda p: (p,),
                        help=f"Comma-separated policies, or all: {', '.join(POLICIES)}.")
    kv_blocks: str | None = opt(None, "--kv-blocks",
                                help="KV blocks per replica, or 'unbounded' (default: from --model/--gpu).")
    model: str = opt("llama-3.1-8b", "--model", "-m", metavar="MODEL",
                     help=f"Catalogue model (KV size, prefill): {model_names()} (aliases and HF ids accepted).")
    gpu: str = opt("h100", "--gpu", metavar="GPU", help=f"GPU: {gpu_names()} (h100 = h100-sxm).")
    dtype: str = opt("bf16", "--dtype", metavar="|".join(DTYPES), help="Weights/KV dtype.")
    tensor_parallel: int = opt(1, "--tensor-parallel", "--tp", help="GPUs per replica.")
    gpu_memory_utilization: float = opt(0.9, "--gpu-memory-utilization", help="vLLM default 0.9.")
    eviction: str = opt("vllm", "--eviction", metavar=one_of(EVICTIONS),
                        help="vllm (LRU free queue) or radix (SGLang; same order at block granularity).")
    prefill_model: str = opt("cost", "--prefill-model", metavar=one_of(PREFILL_MODELS),
                             help="Prefill time: cost (FLOPs), preble or coeffs.")
    prefill_coeffs: str | None = opt(None, "--prefill-coeffs", convert=parse_coeffs,
                                     help="a,b,c,d,e: ms = a + b*new + c*cached + d*new*cached + e*new^2.")
    timing_profile: str | None = opt(
        None, "--timing-profile", metavar="FILE|NAME",
        help="A hardware profile (JSON) fitted to a real engine, or a built-in one by name (e.g. "
             "vllm-cpu-tiny-llama, fitted by `make calibrate`): its prefill coefficients and, unless "
             "--tpot/--decode-slowdown are given, its decode times.")
    mfu: float = opt(0.5, "--mfu", help="Prefill model-FLOPs utilisation (cost model).")
    tpot: float | None = opt(None, "--tpot", to="tpot_s",
                             help="Seconds per output token at batch 1 (default 0.02, or the profile's).")
    decode_slowdown: float | None = opt(
        None, "--decode-slowdown",
        help="Per-token slowdown per extra running sequence (default 0.004, or the profile's).")
    token_budget: int = opt(8192, "--token-budget", help="Tokens per engine step (chunked prefill).")
    max_num_seqs: int = opt(256, "--max-num-seqs", help="Running sequences per replica.")
    batch_prefills: bool = opt(
        False, "--batch-prefills/--serial-prefills",
        help="Run every waiting request that fits (--max-num-seqs, --token-budget) in one prefill step, "
             "paying the fixed prefill term once, as vLLM's scheduler does (default: one at a time).")
    default_output_tokens: int = opt(128, "--default-output-tokens", help="Output length when the log has none.")
    knowledge: str | None = opt(None, "--knowledge", metavar=one_of(KNOWLEDGE),
                                help="The router's view of the caches.")
    event_delay: float = opt(0.0, "--event-delay", to="event_delay_s", help="KV-event delay in seconds (delayed view).")
    approx_ttl: float = opt(120.0, "--approx-ttl", to="approx_ttl_s", help="TTL of the approximate view (Dynamo 120).")
    restart: list[str] = opt([], "--restart", help="Wipe a replica's cache: TIME_S:REPLICA.")
    add_replica: list[str] = opt([], "--add-replica", help="Add a cold replica at TIME_S.")
    remove_replica: list[str] = opt([], "--remove-replica", help="Stop routing to TIME_S:REPLICA.")
    isolate_tenants: bool = opt(False, "--isolate-tenants", help="No sharing across tenants.")
    compare_isolation: bool = opt(False, "--compare-isolation",
                                  help="Also replay with isolation flipped; report what isolation costs.")
    cache_generated: bool = opt(False, "--cache-generated",
                                help="Cache answers for the conversation's next turn (vLLM does).")
    reserve_decode: bool = opt(True, "--reserve-decode-blocks/--no-reserve-decode-blocks", to="reserve_decode_blocks",
                               help="Reserve each request's decode blocks at admission.")
    rate_scale: float = opt(1.0, "--rate-scale", help="Compress time: 2 = twice the request rate.")
    rps: float | None = opt(None, "--rps", help="Compress time so the log's busy periods run at this request rate "
                            "(req/s).")
    target_rps: float | None = opt(None, "--target-rps", hidden=True, help="Old name of --rps.")
    warmup_s: float = opt(0.0, "--warmup-s", help="Exclude requests arriving before this time.")
    seed: int = opt(0, "--seed", help="Seed for random choices (same seed => same tables).")
    param: list[str] = opt([], "--param", to="policy_params", convert=parse_params,
                           help="Policy parameter POLICY.NAME=VALUE (repeatable).")
    decision_log: bool = opt(True, "--decision-log/--no-decision-log",
                             help="Write the per-request sim_decisions table.")

    def sim_fields(self, rate: float | None) -> dict[str, Any]:
        """The SimConfig options these set, for `SimConfig.from_options` (`rate`: --rps or its old name,
        resolved by the caller)."""
        kvb, unbounded = parse_kv_blocks(self.kv_blocks)
        return {**config_fields(self, _SEVERAL), "kv_blocks": kvb, "unbounded_kv": unbounded,
                "events": parse_events(self.restart, self.add_replica, self.remove_replica), "target_rps": rate}


@dataclass(frozen=True)
class TierOptions:
    """KV tiers below the GPU and prefill/decode disaggregation (docs/simulator.md)."""

    host_kv_blocks: str | None = opt(None, "--host-kv-blocks", convert=_tier_blocks("--host-kv-blocks"),
                                     help="Host-memory KV tier per replica, in blocks or 'unbounded'.")
    host_kv_gib: float = opt(0.0, "--host-kv-gib", help="Host-memory KV tier per replica, GiB.")
    host_link: str = opt("pcie5-x16", "--host-link", metavar="LINK|GB/s",
                         help="Host-to-GPU link: pcie5-x16 (63 GB/s), pcie4-x16, rdma-400g, rdma-200g, nvlink4, "
                              "or GB/s.")
    host_write: str = opt("through", "--host-write", metavar="through|back",
                          help="Copy computed blocks to host (through: vLLM offloading, HiCache default) or on GPU "
                               "eviction.")
    shared_kv_blocks: str | None = opt(None, "--shared-kv-blocks", convert=_tier_blocks("--shared-kv-blocks"),
                                       help="Fleet-shared KV store, in blocks or 'unbounded'.")
    shared_kv_gib: float = opt(0.0, "--shared-kv-gib", help="Fleet-shared KV store, GiB.")
    shared_read: str = opt("rdma-400g", "--shared-read", metavar="LINK|GB/s",
                           help="Store-to-GPU read link (per request).")
    shared_write: str = opt("rdma-400g", "--shared-write", metavar="LINK|GB/s",
                            help="The store's write link (all writes queue).")
    shared_latency_ms: float = opt(1.0, "--shared-latency-ms", to="shared_latency_s", convert=_ms_to_s,
                                   help="Per-request store latency.")
    router_sees_tiers: bool = opt(False, "--router-sees-tiers",
                                  help="Routers with exact KV events score lower tiers too (Dynamo, llm-d).")
    prefill_replicas: int | None = opt(None, "--prefill-replicas",
                                       help="Disaggregated: prefill pool size (replaces --replicas).")
    decode_replicas: int = opt(0, "--decode-replicas", help="Disaggregated: decode pool size.")
    decode_kv_blocks: int | None = opt(None, "--decode-kv-blocks",
                                       help="KV blocks per decode worker (default: as a prefill worker).")
    pd_link: str = opt("rdma-400g", "--pd-link", metavar="LINK|GB/s",
                       help="Prefill-to-decode KV link (NIXL over RDMA).")
    pd_latency_ms: float = opt(0.5, "--pd-latency-ms", to="pd_latency_s", convert=_ms_to_s,
                               help="Per-transfer latency.")
    compare_colocated: bool = opt(True, "--compare-colocated/--no-compare-colocated",
                                  help="Disaggregated: also replay a co-located fleet of prefill + decode replicas.")
    tier_sweep: bool = opt(False, "--tier-sweep",
                           help="Capacity view: hit rate over GPU x second-tier sizes (first policy).")

    def sim_fields(self) -> dict[str, Any]:
        """The SimConfig fields these options set; --prefill-replicas (with --decode-replicas) is the
        disaggregated fleet's `replicas`."""
        out = config_fields(self, frozenset({"prefill_replicas"}))
        if self.prefill_replicas is not None:
            if not self.decode_replicas:
                raise UsageError("--prefill-replicas needs --decode-replicas (a disaggregated fleet)")
            out["replicas"] = self.prefill_replicas
        return out


@dataclass(frozen=True)
class LogOptions:
    """The analyze options for LOGS given to simulate (refused with a run directory); each sets the
    AnalyzeConfig field `to` (None: not given, so analyze's own default and prefixscan.toml apply)."""

    fmt: str | None = opt(None, "--format", metavar=one_of(RECORD_FORMATS), to="format",
                          help="Logs: record shape (default auto).")
    order: str | None = opt(None, "--order", metavar=one_of(ORDERS), help="Logs: time or input order.")
    field: list[str] = opt([], "--field", metavar="NAME=PATH", to="fields", convert=lambda v: pairs(v) or None,
                           help="Logs: map a field (repeatable).")
    tokenizer: str | None = opt(None, "--tokenizer",
                                help="Logs: tiktoken:<encoding>, hf:<local dir or hub id>, or none.")
    block_size: int | None = opt(None, "--block-size", help="Logs: KV block size in tokens (default 16).")
    hash_block_size: int | None = opt(None, "--hash-block-size", help="Logs: block size of hashed traces.")
    granularity: str | None = opt(None, "--granularity", metavar=one_of(GRANULARITIES),
                                  help="Logs: block (vLLM) or token (SGLang page size 1).")
    hash_algo: str | None = opt(None, "--hash", to="hash", help="Logs: block hash values (xxh3 or vllm:ALGO).")
    hash_seed: str | None = opt(None, "--hash-seed", help="Logs: PYTHONHASHSEED for --hash vllm:*.")
    lora_path: list[str] = opt([], "--lora-path", to="lora_paths",
                               convert=lambda v: pairs(v, "--lora-path", "NAME=PATH") or None,
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
