"""`prefixscan simulate RUN_DIR`: replay the run's requests over N replicas under each routing policy."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import typer

from prefixscan.cli.choices import (
    DTYPES,
    EVICTIONS,
    KNOWLEDGE,
    POLICIES,
    PREFILL_MODELS,
    gpu_names,
    model_names,
    one_of,
)
from prefixscan.cli.common import handle_errors, safe, show_progress, stderr_console, stdout_console
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
        mfu: float = typer.Option(0.5, "--mfu", help="Prefill model-FLOPs utilisation (cost model)."),
        tpot: float = typer.Option(0.02, "--tpot", help="Seconds per output token at batch 1."),
        decode_slowdown: float = typer.Option(
            0.004, "--decode-slowdown", help="Per-token slowdown per extra running sequence."
        ),
        token_budget: int = typer.Option(
            8192, "--token-budget", help="Tokens per engine step (chunked prefill)."
        ),
        max_num_seqs: int = typer.Option(256, "--max-num-seqs", help="Running sequences per replica."),
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
        target_rps: float = typer.Option(None, "--target-rps", help="Compress time to this request rate."),
        warmup_s: float = typer.Option(0.0, "--warmup-s", help="Exclude requests arriving before this time."),
        seed: int = typer.Option(0, "--seed", help="Seed for random choices (same seed => same tables)."),
        param: list[str] = typer.Option(
            [], "--param", help="Policy parameter POLICY.NAME=VALUE (repeatable)."
        ),
        decision_log: bool = typer.Option(
            True, "--decision-log/--no-decision-log", help="Write the per-request sim_decisions table."
        ),
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
        from prefixscan.sim import SimConfig, SimResult
        from prefixscan.sim import simulate as run_sim

        if load:
            _show(SimResult.load(inputs[0]), json_out, quiet, stderr_console(quiet))
            return

        kvb, unbounded = parse_kv_blocks(kv_blocks)
        coeffs = ()
        if prefill_coeffs:
            try:
                coeffs = tuple(float(x) for x in prefill_coeffs.split(",") if x.strip())
            except ValueError:
                raise UsageError(
                    f"--prefill-coeffs expects numbers a,b,c,d,e, got {prefill_coeffs!r}"
                ) from None
            if prefill_model == "cost":
                prefill_model = "coeffs"
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
            mfu=mfu,
            tpot_s=tpot,
            decode_slowdown=decode_slowdown,
            token_budget=token_budget,
            max_num_seqs=max_num_seqs,
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
            target_rps=target_rps,
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
            if len(inputs) > 1 or not (Path(run_path) / "manifest.json").exists():
                run_path, tmp = _analyze_first(inputs, output, force, quiet, console)
            if show_progress(quiet):
                with console.status("simulating...") as status:
                    result = run_sim(
                        run_path, cfg, progress=lambda n, i, k: status.update(f"policy {i + 1}/{k}: {n}...")
                    )
            else:
                result = run_sim(run_path, cfg)
            if save and tmp is None:
                result.save(run_path)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        _show(result, json_out, quiet, console)
        if not quiet and save and tmp is None:
            console.print(
                f"wrote sim_policies, sim_replicas, sim_timeline{', sim_decisions' if decision_log else ''} "
                f"to {safe(run_path)}"
            )


def _show(result: Any, json_out: bool, quiet: bool, console: Any) -> None:
    """JSON on stdout and/or the rendered tables (on stderr when stdout carries JSON)."""
    if json_out:
        typer.echo(result.dumps())
    if not quiet:
        from prefixscan.report.simulate_terminal import render

        render(result, stdout_console() if not json_out else console)


def _analyze_first(
    inputs: list[str], output: str | None, force: bool, quiet: bool, console: Any
) -> tuple[str, str | None]:
    """Logs given instead of a run: analyse them into -o (or a temporary run that is removed after)."""
    import prefixscan

    if not hasattr(prefixscan, "analyze"):  # pragma: no cover - depends on the tree
        raise UsageError(f"{inputs[0]} is not a run directory; run `prefixscan analyze` on it first")
    tmp = None
    target = output
    if target is None:
        tmp = tempfile.mkdtemp(prefix="prefixscan-sim-")
        target = str(Path(tmp) / "run")
        if not quiet:
            console.print("analysing the logs first (pass -o RUN_DIR to keep the run and the sim tables)")
    prefixscan.analyze(*inputs, output=target, force=force, quiet=True)
    return target, tmp
