"""The compiled replay: `engine.replay`'s event loop, knowledge views and every policy in numba kernels.

`replay_fast(w, policy, cfg, serving, capacity)` returns the same `Outcome` as the reference
`engine.replay` (same replica per request, cached tokens, times, reasons, candidates, evictions and area
integrals), 5-30x faster. The reference stays the obviously-correct model; `tests/test_sim_fast.py`
asserts the two agree on random workloads for every policy and knowledge mode.
`unsupported(policy)` names what the fast path cannot run (then `simulate` uses the reference);
`run_replay` picks the engine (argument, else $PREFIXSCAN_SIM_ENGINE, else compiled where supported).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType

import numpy as np

from prefixscan.sim.config import SimConfig
from prefixscan.sim.engine import Outcome, max_hit_blocks, request_budget, table_offsets
from prefixscan.sim.fast import arrays as A
from prefixscan.sim.fast import buffers
from prefixscan.sim.fast import layout as L
from prefixscan.sim.fast.cacheguard import guard
from prefixscan.sim.fast.policies.base import PolicyArrays
from prefixscan.sim.kvcache import KVState
from prefixscan.sim.policies.base import Policy
from prefixscan.sim.timing import ServingModel
from prefixscan.sim.workload import Workload

ENGINES = ("auto", "fast", "reference")
ENV = "PREFIXSCAN_SIM_ENGINE"

__all__ = ["ENGINES", "ENV", "engine_choice", "release_buffers", "replay_fast", "run_replay", "unsupported"]

release_buffers = buffers.release


def compiled_form(policy: Policy) -> ModuleType | None:
    """The module of a built-in policy, which holds its compiled form (`setup`, `kernel`) beside its reference;
    None for any other class (a subclass may change the rule).

    The registry is imported here, not at the top: every policy module imports this package's layout, so
    when `sim.policies` is imported first this package runs while the registry is still being built."""
    from prefixscan.sim.policies import POLICIES

    cls = POLICIES.get(policy.name)
    return sys.modules[cls.__module__] if cls is not None and type(policy) is cls else None


def unsupported(policy: Policy) -> str | None:
    """Why this policy cannot run compiled (None: it can). Only parameter values the reference itself
    handles oddly or rejects at run time fall back."""
    if compiled_form(policy) is None:
        return f"{type(policy).__name__} is not a built-in policy"
    p = policy.params
    if getattr(p, "prefix_blocks", 1) < 1:
        return "prefix_blocks < 1 (the reference indexes from the end)"
    if policy.name == "prefix_hash" and not p.window_s > 0:
        return "prefix_hash.window_s <= 0"
    return None


def _unsupported_config(cfg: SimConfig) -> str | None:
    """Config features only the reference engine models (KV tiers, disaggregated prefill/decode)."""
    if cfg.tiered:
        return "KV tiers below the GPU (host / shared store) run on the reference engine"
    if cfg.disaggregated:
        return "prefill/decode disaggregation runs on the reference engine"
    return None


def engine_choice(engine: str | None) -> str:
    """The engine asked for: the argument, else $PREFIXSCAN_SIM_ENGINE, else "auto"."""
    choice = engine or os.environ.get(ENV) or "auto"
    if choice not in ENGINES:
        from prefixscan.errors import UsageError

        raise UsageError(f"unknown simulator engine {choice!r}; use {', '.join(ENGINES)}")
    return choice


def _reasons(codes: np.ndarray, name: Callable[[int], str]) -> tuple[np.ndarray, list[str]]:
    """Renumber reason codes by first appearance, as the reference's table grows."""
    if len(codes) == 0:
        return codes.astype(np.int16), []
    uniq, first = np.unique(codes, return_index=True)
    order = uniq[np.argsort(first, kind="stable")]
    remap = np.zeros(int(uniq.max()) + 1, dtype=np.int16)
    remap[order] = np.arange(len(order), dtype=np.int16)
    return remap[codes], [name(int(c)) for c in order]


def replay_fast(w: Workload, policy: Policy, cfg: SimConfig, serving: ServingModel, capacity: int) -> Outcome:
    """`engine.replay`, compiled: identical outcome arrays for every built-in policy and knowledge mode."""
    from prefixscan.sim.fast.kernel import run

    guard()
    slots = cfg.replicas + sum(1 for e in cfg.events if e.action == "add")
    n = w.n
    nb, pin, extra, oversized = request_budget(w, cfg, capacity)
    u = max(w.n_unique, 1)
    n_pool = max(capacity, 1)
    kv = KVState(slots, w.n_unique, capacity, zeroed=(
        buffers.take("res", (u, slots), np.int8, 0), buffers.take("kf", (slots, u, 2), np.int32, 0),
        buffers.take("sl", (slots, n_pool, 6), np.int32, None)))
    toff = table_offsets(pin, extra)
    tbl = np.zeros(max(int(toff[-1]), 1), dtype=np.int32)
    kmode = policy.knowledge_mode(cfg.knowledge)
    vopts = {"delay_s": cfg.event_delay_s, "ttl_s": cfg.approx_ttl_s}
    vopts.update(policy.view_options())
    ci, cf, g, fp = A.cluster(cfg, slots, capacity, serving, w.block_size)
    budget = (3 * n + len(cfg.events) + 1, 3 * int(pin.sum() + extra.sum()) + 1)
    g[L.G_VMODE], (items, dids, dres, last) = A.view_arrays(kmode, vopts, fp, slots, kv.res.shape[1], budget)
    form = compiled_form(policy)
    if form is None:
        raise ValueError(unsupported(policy))
    pa: PolicyArrays = form.setup(policy, w, slots)
    rng = np.random.default_rng([cfg.seed, sum(map(ord, policy.name))])
    uni = rng.random(max(n, 1))  # the stream ClusterView.uniform draws, 4096 at a time
    rq, rf = A.request_rows(w, nb, pin, extra, toff, max_hit_blocks(w, pin))
    cand = np.zeros((max(n, 1), pa.width), dtype=np.int32)
    hcap = min(n, slots * cfg.max_num_seqs) + 1
    ht, hm = np.zeros(hcap), np.zeros((hcap, 3), dtype=np.int64)
    ev_t, ev_a, ev_r = A.events(cfg)
    horizon = run(
        pa.code, w.offsets, w.blocks, rq, rf, cand, ci, cf, g, fp, kv.res.T, kv.kf, kv.sl, kv.slf, kv.meta,
        kv.evictions, kv.evict_age_sum, kv.evict_hist, kv.scratch, tbl, items, dids, dres, last, ht, hm,
        pa.pf, pa.pi, pa.sf, pa.si, pa.pu, uni, ev_t, ev_a, ev_r,
    )
    for name, a in (("res", kv.res.T), ("kf", kv.kf), ("sl", kv.sl), ("dres", dres), ("last", last)):
        if a.size > 1:
            buffers.give(name, a)
    reason, reasons = _reasons(rq[:, L.RQ_REASON], pa.reasons)
    cand_n = rq[:, L.RQ_CAND_N]
    cand_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(cand_n, out=cand_off[1:])
    return Outcome(
        policy=policy.name,
        n_slots=slots,
        replica=rq[:, L.RQ_REPLICA].astype(np.int32),
        start_s=rf[:, L.RF_START].copy(),
        first_token_s=rf[:, L.RF_FIRST].copy(),
        finish_s=rf[:, L.RF_FINISH].copy(),
        cached_tokens=rq[:, L.RQ_CACHED].copy(),
        predicted_cached=rq[:, L.RQ_PREDICTED].copy(),
        best_cached=rq[:, L.RQ_BEST].copy(),
        routed_cached=rq[:, L.RQ_ROUTED].copy(),
        routed_blocks=rq[:, L.RQ_ROUTED_K].astype(np.int32),
        prefill_s=rf[:, L.RF_PRE_S].copy(),
        reason=reason,
        reasons=reasons,
        cand_ids=cand[:n][np.arange(pa.width) < cand_n[:, None]],
        cand_off=cand_off,
        evictions=kv.evictions.copy(),
        evict_age_sum=kv.evict_age_sum.copy(),
        evict_hist=kv.evict_hist.copy(),
        area_outstanding=cf[L.AREA_OUT].copy(),
        area_waiting=cf[L.AREA_WAIT].copy(),
        horizon_s=float(horizon),
        oversized=oversized,
        knowledge=kmode,
        extra=pa.stats(pa.sf, pa.si),
    )


def run_replay(
    w: Workload, policy: Policy, cfg: SimConfig, serving: ServingModel, capacity: int, engine: str | None = None
) -> tuple[Outcome, str]:
    """Replay with the engine asked for; returns the outcome and which engine ran ("fast"/"reference").

    "auto" runs compiled whenever `unsupported(policy)` is None, "fast" insists, "reference" never does.
    """
    from prefixscan.sim.engine import replay

    choice = engine_choice(engine)
    if choice != "reference":
        why = unsupported(policy) or _unsupported_config(cfg)
        if why is None:
            return replay_fast(w, policy, cfg, serving, capacity), "fast"
        if choice == "fast":
            from prefixscan.errors import UsageError

            raise UsageError(f"the compiled replay cannot run {policy.name}: {why}")
    return replay(w, policy, cfg, serving, capacity), "reference"
