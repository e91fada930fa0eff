"""`prefixscan simulate RUN_DIR`: replay the run's requests over N replicas under each routing policy."""

from __future__ import annotations

import contextlib
import shutil
from typing import Any

import typer

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
from prefixscan.cli.common import handle_errors, safe, show_progress, stderr_console, stdout_console
from prefixscan.cli.estimate import one_rate, option_sources
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
    for text in restart:
        t, r = _split_pair(text, "--restart")
        if r < 0:
            raise UsageError(f"--restart needs a replica: TIME_S:REPLICA, got {text!r}")
        evs.append(ReplicaEvent(t, "restart", r))
    for text in add:
        evs.append(ReplicaEvent(_split_pair(text, "--add-replica")[0], "add"))
    for text in remove:
        t, r = _split_pair(text, "--remove-replica")
        if r < 0:
            raise UsageError(f"--remove-replica needs a replica: TIME_S:REPLICA, got {text!r}")
        evs.append(ReplicaEvent(t, "remove", r))
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


def parse_kv_blocks(text: str | None) -> tuple[int | None, bool]:
    if text is None:
        return None, False
    if text.strip().lower() in ("unbounded", "inf", "infinite"):
        return None, True
    try:
        return int(float(text)), False
    except ValueError:
        raise UsageError(f"--kv-blocks expects a block count or 'unbounded', got {text!r}") from None


def _tier_blocks(text: str | None, flag: str) -> int:
    if text is None:
        return 0
    if text.strip().lower() in ("unbounded", "inf", "infinite"):
        return -1
    try:
        return int(float(text))
    except ValueError:
        raise UsageError(f"{flag} expects a block count or 'unbounded', got {text!r}") from None


def tier_options(
    host_kv_blocks: str | None, host_kv_gib: float, host_link: str, host_write: str,
    shared_kv_blocks: str | None, shared_kv_gib: float, shared_read: str, shared_write: str,
    shared_latency_ms: float, router_sees_tiers: bool, decode_replicas: int, decode_kv_blocks: int | None,
    pd_link: str, pd_latency_ms: float, compare_colocated: bool,
) -> dict[str, Any]:
    """The SimConfig fields of the KV-tier and disaggregation options."""
    return {
        "host_kv_blocks": _tier_blocks(host_kv_blocks, "--host-kv-blocks"),
        "host_kv_gib": host_kv_gib,
        "host_link": host_link,
        "host_write": host_write,
        "shared_kv_blocks": _tier_blocks(shared_kv_blocks, "--shared-kv-blocks"),
        "shared_kv_gib": shared_kv_gib,
        "shared_read": shared_read,
        "shared_write": shared_write,
        "shared_latency_s": shared_latency_ms / 1000.0,
        "router_sees_tiers": router_sees_tiers,
        "decode_replicas": decode_replicas,
        "decode_kv_blocks": decode_kv_blocks,
        "pd_link": pd_link,
        "pd_latency_s": pd_latency_ms / 1000.0,
        "compare_colocated": compare_colocated,
    }


def register(app: typer.Typer) -> None:
    """Add the `simulate` command to the application."""

    @app.command("simulate", no_args_is_help=True)
    @handle_errors
    def simulate(
        inputs: list[str] = typer.Argument(..., help="A run directory, or log files to analyse first."),
        replicas: int = typer.Option(8, "--replicas", "-n", help="Engine replicas."),
        policies: str = typer.Option("all", "--policies", "-p", metavar="all|POLICY,...",
                                     help=f"Comma-separated policies, or all: {', '.join(POLICIES)}."),
        kv_blocks: str = typer.Option(
            None, "--kv-blocks", help="KV blocks per replica, or 'unbounded' (default: from --model/--gpu)."
        ),
        model: str = typer.Option(
            "llama-3.1-8b", "--model", "-m", metavar="MODEL",
            help=f"Catalogue model (KV size, prefill): {model_names()} (aliases and HF ids accepted)."
        ),
        gpu: str = typer.Option("h100", "--gpu", metavar="GPU", help=f"GPU: {gpu_names()} (h100 = h100-sxm)."),
        dtype: str = typer.Option("bf16", "--dtype", metavar="|".join(DTYPES), help="Weights/KV dtype."),
        tensor_parallel: int = typer.Option(1, "--tensor-parallel", "--tp", help="GPUs per replica."),
        gpu_memory_utilization: float = typer.Option(
            0.9, "--gpu-memory-utilization", help="vLLM default 0.9."
        ),
        eviction: str = typer.Option(
            "vllm",
            "--eviction",
            metavar=one_of(EVICTIONS),
            help="vllm (LRU free queue) or radix (SGLang; same order at block granularity).",
        ),
        prefill_model: str = typer.Option("cost", "--prefill-model", metavar=one_of(PREFILL_MODELS),
                                                   help="Prefill time: cost (FLOPs), preble or coeffs."),
        prefill_coeffs: str = typer.Option(
            None, "--prefill-coeffs", help="a,b,c,d,e: ms = a + b*new + c*cached + d*new*cached + e*new^2."
        ),
        timing_profile: str = typer.Option(
            None, "--timing-profile", metavar="FILE|NAME",
            help="A hardware profile (JSON) fitted to a real engine, or a built-in one by name (e.g. "
                 "vllm-cpu-tiny-llama, fitted by `make calibrate`): its prefill coefficients and, unless "
                 "--tpot/--decode-slowdown are given, its decode times."
        ),
        mfu: float = typer.Option(0.5, "--mfu", help="Prefill model-FLOPs utilisation (cost model)."),
        tpot: float = typer.Option(
            None, "--tpot", help="Seconds per output token at batch 1 (default 0.02, or the profile's)."
        ),
        decode_slowdown: float = typer.Option(
            None, "--decode-slowdown",
            help="Per-token slowdown per extra running sequence (default 0.004, or the profile's).",
        ),
        token_budget: int = typer.Option(
            8192, "--token-budget", help="Tokens per engine step (chunked prefill)."
        ),
        max_num_seqs: int = typer.Option(256, "--max-num-seqs", help="Running sequences per replica."),
        batch_prefills: bool = typer.Option(
            False, "--batch-prefills/--serial-prefills",
            help="Run every waiting request that fits (--max-num-seqs, --token-budget) in one prefill step, "
                 "paying the fixed prefill term once, as vLLM's scheduler does (default: one at a time).",
        ),
        default_output_tokens: int = typer.Option(
            128, "--default-output-tokens", help="Output length when the log has none."
        ),
        knowledge: str | None = typer.Option(None, "--knowledge", metavar=one_of(KNOWLEDGE),
                                             help="The router's view of the caches."),
        event_delay: float = typer.Option(
            0.0, "--event-delay", help="KV-event delay in seconds (delayed view)."
        ),
        approx_ttl: float = typer.Option(
            120.0, "--approx-ttl", help="TTL of the approximate view (Dynamo 120)."
        ),
        restart: list[str] = typer.Option([], "--restart", help="Wipe a replica's cache: TIME_S:REPLICA."),
        add_replica: list[str] = typer.Option([], "--add-replica", help="Add a cold replica at TIME_S."),
        remove_replica: list[str] = typer.Option(
            [], "--remove-replica", help="Stop routing to TIME_S:REPLICA."
        ),
        isolate_tenants: bool = typer.Option(False, "--isolate-tenants", help="No sharing across tenants."),
        compare_isolation: bool = typer.Option(
            False,
            "--compare-isolation",
            help="Also replay with isolation flipped; report what isolation costs.",
        ),
        cache_generated: bool = typer.Option(
            False, "--cache-generated", help="Cache answers for the conversation's next turn (vLLM does)."
        ),
        reserve_decode: bool = typer.Option(
            True,
            "--reserve-decode-blocks/--no-reserve-decode-blocks",
            help="Reserve each request's decode blocks at admission.",
        ),
        rate_scale: float = typer.Option(
            1.0, "--rate-scale", help="Compress time: 2 = twice the request rate."
        ),
        rps: float = typer.Option(None, "--rps", help="Compress time so the log's busy periods run at this "
                                  "request rate (req/s)."),
        target_rps: float = typer.Option(None, "--target-rps", hidden=True, help="Old name of --rps."),
        warmup_s: float = typer.Option(0.0, "--warmup-s", help="Exclude requests arriving before this time."),
        seed: int = typer.Option(0, "--seed", help="Seed for random choices (same seed => same tables)."),
        param: list[str] = typer.Option(
            [], "--param", help="Policy parameter POLICY.NAME=VALUE (repeatable)."
        ),
        decision_log: bool = typer.Option(
            True, "--decision-log/--no-decision-log", help="Write the per-request sim_decisions table."
        ),
        # --- options for LOGS: how they are analysed first (refused with a run directory) ---
        fmt: str = typer.Option(None, "--format", metavar=one_of(RECORD_FORMATS),
                                help="Logs: record shape (default auto)."),
        order: str = typer.Option(None, "--order", metavar=one_of(ORDERS), help="Logs: time or input order."),
        field: list[str] = typer.Option([], "--field", metavar="NAME=PATH", help="Logs: map a field (repeatable)."),
        tokenizer: str = typer.Option(
            None, "--tokenizer", help="Logs: tiktoken:<encoding>, hf:<local dir or hub id>, or none."
        ),
        block_size: int = typer.Option(None, "--block-size", help="Logs: KV block size in tokens (default 16)."),
        hash_block_size: int = typer.Option(None, "--hash-block-size", help="Logs: block size of hashed traces."),
        granularity: str = typer.Option(None, "--granularity", metavar=one_of(GRANULARITIES),
                                        help="Logs: block (vLLM) or token (SGLang page size 1)."),
        hash_algo: str = typer.Option(None, "--hash", help="Logs: block hash values (xxh3 or vllm:ALGO)."),
        hash_seed: str = typer.Option(None, "--hash-seed", help="Logs: PYTHONHASHSEED for --hash vllm:*."),
        lora_path: list[str] = typer.Option([], "--lora-path", help="Logs: NAME=PATH of a LoRA adapter."),
        strict: bool = typer.Option(False, "--strict", help="Logs: stop at the first malformed record."),
        no_infer_conversations: bool = typer.Option(
            False, "--no-infer-conversations", help="Logs: do not infer conversations from message prefixes."
        ),
        # --- where the simulation goes ---
        name: str = typer.Option(
            None, "--name", help="Store the simulation under this name beside the others (default: 'default'; "
                                 "re-running a name replaces it). With --load: which one to show."
        ),
        list_sims: bool = typer.Option(False, "--list", help="List the run's stored simulations and exit."),
        output: str = typer.Option(None, "-o", "--output", help="Run directory to write when given logs."),
        force: bool = typer.Option(False, "--force", help="Replace an existing -o run directory."),
        save: bool = typer.Option(
            True, "--save/--no-save", help="Write the sim tables into the run directory."
        ),
        load: bool = typer.Option(
            False, "--load", help="Re-render the run's saved simulation; do not re-run."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print the metrics as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress or table on stderr."),
        # --- KV tiers below the GPU and prefill/decode disaggregation (docs/simulator.md) ---
        host_kv_blocks: str = typer.Option(
            None, "--host-kv-blocks", help="Host-memory KV tier per replica, in blocks or 'unbounded'."
        ),
        host_kv_gib: float = typer.Option(0.0, "--host-kv-gib", help="Host-memory KV tier per replica, GiB."),
        host_link: str = typer.Option(
            "pcie5-x16", "--host-link", metavar="LINK|GB/s", help="Host-to-GPU link: pcie5-x16 (63 GB/s), "
            "pcie4-x16, rdma-400g, rdma-200g, nvlink4, or GB/s."
        ),
        host_write: str = typer.Option(
            "through", "--host-write", metavar="through|back",
            help="Copy computed blocks to host (through: vLLM offloading, HiCache default) or on GPU eviction.",
        ),
        shared_kv_blocks: str = typer.Option(
            None, "--shared-kv-blocks", help="Fleet-shared KV store, in blocks or 'unbounded'."
        ),
        shared_kv_gib: float = typer.Option(0.0, "--shared-kv-gib", help="Fleet-shared KV store, GiB."),
        shared_read: str = typer.Option(
            "rdma-400g", "--shared-read", metavar="LINK|GB/s", help="Store-to-GPU read link (per request)."
        ),
        shared_write: str = typer.Option(
            "rdma-400g", "--shared-write", metavar="LINK|GB/s", help="The store's write link (all writes queue)."
        ),
        shared_latency_ms: float = typer.Option(1.0, "--shared-latency-ms", help="Per-request store latency."),
        router_sees_tiers: bool = typer.Option(
            False, "--router-sees-tiers", help="Routers with exact KV events score lower tiers too (Dynamo, llm-d)."
        ),
        prefill_replicas: int = typer.Option(
            None, "--prefill-replicas", help="Disaggregated: prefill pool size (replaces --replicas)."
        ),
        decode_replicas: int = typer.Option(0, "--decode-replicas", help="Disaggregated: decode pool size."),
        decode_kv_blocks: int = typer.Option(
            None, "--decode-kv-blocks", help="KV blocks per decode worker (default: as a prefill worker)."
        ),
        pd_link: str = typer.Option(
            "rdma-400g", "--pd-link", metavar="LINK|GB/s", help="Prefill-to-decode KV link (NIXL over RDMA)."
        ),
        pd_latency_ms: float = typer.Option(0.5, "--pd-latency-ms", help="Per-transfer latency."),
        compare_colocated: bool = typer.Option(
            True, "--compare-colocated/--no-compare-colocated",
            help="Disaggregated: also replay a co-located fleet of prefill + decode replicas.",
        ),
        tier_sweep: bool = typer.Option(
            False, "--tier-sweep", help="Capacity view: hit rate over GPU x second-tier sizes (first policy)."
        ),
    ) -> None:
        """Replay a run over N replicas with finite KV memory under each routing policy.

        Example: prefixscan simulate runs/demo --replicas 8 --policies all --kv-blocks 20000
        """
        from prefixscan.cli import simulate_logs
        from prefixscan.io.rundir import extending
        from prefixscan.io.simindex import check_name
        from prefixscan.sim import SimConfig, SimResult
        from prefixscan.sim import simulate as run_sim

        if name is not None:
            check_name(name)
        if list_sims:
            _list(inputs, json_out)
            return
        if load:
            _show(SimResult.load(inputs[0], name), json_out, quiet, stderr_console(quiet))
            return
        aopts = simulate_logs.analyze_options(
            fmt, order, field, tokenizer, block_size, hash_block_size, granularity, hash_algo, hash_seed,
            lora_path, strict, no_infer_conversations,
        )
        prefill_model, coeffs, tpot, decode_slowdown, profile_name = _timing(
            prefill_model, prefill_coeffs, timing_profile, tpot, decode_slowdown
        )

        kvb, unbounded = parse_kv_blocks(kv_blocks)
        know = knowledge or ("delayed" if event_delay > 0 else "exact")
        if prefill_replicas is not None:
            if not decode_replicas:
                raise UsageError("--prefill-replicas needs --decode-replicas (a disaggregated fleet)")
            replicas = prefill_replicas
        cfg = SimConfig(
            replicas=replicas,
            policies=(policies,),
            kv_blocks=kvb,
            unbounded_kv=unbounded,
            model=model,
            gpu=gpu,
            dtype=dtype,
            tensor_parallel=tensor_parallel,
            gpu_memory_utilization=gpu_memory_utilization,
            eviction=eviction,
            prefill_model=prefill_model,
            prefill_coeffs=coeffs,
            timing_profile=profile_name,
            mfu=mfu,
            tpot_s=tpot,
            decode_slowdown=decode_slowdown,
            token_budget=token_budget,
            max_num_seqs=max_num_seqs,
            batch_prefills=batch_prefills,
            default_output_tokens=default_output_tokens,
            knowledge=know,
            event_delay_s=event_delay,
            approx_ttl_s=approx_ttl,
            events=parse_events(restart, add_replica, remove_replica),
            isolate_tenants=isolate_tenants,
            compare_isolation=compare_isolation,
            reserve_decode_blocks=reserve_decode,
            cache_generated=cache_generated,
            rate_scale=rate_scale,
            target_rps=one_rate(rps, target_rps, "--target-rps", option_sources(("rps", "target_rps"), locals())),
            warmup_s=warmup_s,
            seed=seed,
            policy_params=parse_params(param),
            decision_log=decision_log,
            **tier_options(
                host_kv_blocks, host_kv_gib, host_link, host_write, shared_kv_blocks, shared_kv_gib, shared_read,
                shared_write, shared_latency_ms, router_sees_tiers, decode_replicas, decode_kv_blocks, pd_link,
                pd_latency_ms, compare_colocated,
            ),
            tier_sweep=tier_sweep,
        )
        console = stderr_console(quiet)
        tmp: str | None = None
        run_path = inputs[0]
        try:
            if simulate_logs.is_run(inputs):
                simulate_logs.refuse_on_run(run_path, aopts)
            else:
                run_path, tmp = simulate_logs.analyze_first(inputs, output, force, quiet, console, aopts)
            writing = save and tmp is None
            with extending(run_path) if writing else contextlib.nullcontext():  # the run's lock throughout
                if show_progress(quiet):
                    with console.status("simulating...") as status:
                        result = run_sim(
                            run_path, cfg, progress=lambda n, i, k: status.update(f"policy {i + 1}/{k}: {n}...")
                        )
                else:
                    result = run_sim(run_path, cfg)
                where = result.save(run_path, name or "default") if writing else None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        _show(result, json_out, quiet, console)
        if not quiet and where is not None:
            console.print(
                f"wrote simulation {safe(name or 'default')!r} (sim_policies, sim_replicas, sim_timeline"
                f"{', sim_decisions' if decision_log else ''}) to {safe(str(where))}"
            )


def _show(result: Any, json_out: bool, quiet: bool, console: Any) -> None:
    """JSON on stdout and/or the rendered tables (on stderr when stdout carries JSON)."""
    if json_out:
        typer.echo(result.dumps())
    if not quiet:
        from prefixscan.report.simulate_terminal import render

        render(result, stdout_console() if not json_out else console)


def _timing(
    prefill_model: str, prefill_coeffs: str | None, profile: str | None, tpot: float | None,
    slowdown: float | None,
) -> tuple[str, tuple[float, ...], float, float, str | None]:
    """(prefill model, coefficients, tpot, decode slowdown, profile name) from the timing options."""
    coeffs: tuple[float, ...] = ()
    name = None
    if profile and prefill_coeffs:
        raise UsageError("give --timing-profile or --prefill-coeffs, not both")
    if prefill_coeffs:
        try:
            coeffs = tuple(float(x) for x in prefill_coeffs.split(",") if x.strip())
        except ValueError:
            raise UsageError(f"--prefill-coeffs expects numbers a,b,c,d,e, got {prefill_coeffs!r}") from None
        if prefill_model == "cost":
            prefill_model = "coeffs"
    if profile:
        from prefixscan.sim.timing import load_profile

        prof = load_profile(profile)
        p, name = prof.prefill, prof.name
        coeffs, prefill_model = (p.a, p.b_new, p.c_cached, p.d_new_cached, p.e_new2), "profile"
        tpot = prof.tpot_s if tpot is None else tpot
        slowdown = prof.decode_slowdown if slowdown is None else slowdown
    elif prefill_model == "profile":
        raise UsageError("--prefill-model profile needs --timing-profile FILE|NAME")
    tpot = 0.02 if tpot is None else tpot
    return prefill_model, coeffs, tpot, 0.004 if slowdown is None else slowdown, name


def _list(inputs: list[str], json_out: bool) -> None:
    """`simulate RUN --list`: the stored simulations, one line each (JSON with --json)."""
    from prefixscan.io.run import read_manifest
    from prefixscan.io.simindex import listing

    if len(inputs) != 1:
        raise UsageError("--list takes one run directory")
    rows = listing(read_manifest(inputs[0]), inputs[0])
    if json_out:
        import json

        typer.echo(json.dumps(rows, sort_keys=True))
        return
    from prefixscan.report.simulate_terminal import render_listing

    render_listing(rows, inputs[0], stdout_console())
