"""The compiled replay: `engine.replay`'s event loop, knowledge views and every policy in numba kernels.

`replay_fast(w, policy, cfg, serving, capacity)` returns the same `Outcome` as the reference
`engine.replay` (same replica per request, cached tokens, times, reasons, candidates, evictions and area
integrals), 5-30x faster. The reference stays the obviously-correct model; `tests/test_sim_fast.py`
asserts the two agree on random workloads for every policy and knowledge mode.
`unsupported(policy)` names what the fast path cannot run (then `simulate` uses the reference);
`run_replay` picks the engine (argument, else $PREFIXSCAN_SIM_ENGINE, else compiled where supported).
Below them: the arrays a replay runs on and the large ones kept between replays, and the guard that keeps
numba's on-disk cache honest. The event loop is `kernel.py`, the policies' shared helpers `shared.py`.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

from prefixscan.sim.config import SimConfig
from prefixscan.sim.fast import layout as L
from prefixscan.sim.fast.shared import PolicyArrays
from prefixscan.sim.knowledge import view_kind
from prefixscan.sim.kvcache import KVState
from prefixscan.sim.outcome import Outcome, max_hit_blocks, offsets, request_budget
from prefixscan.sim.policies.base import Policy
from prefixscan.sim.timing import ServingModel
from prefixscan.sim.workload import Workload

ENGINES = ("auto", "fast", "reference")
ENV = "PREFIXSCAN_SIM_ENGINE"

__all__ = ["ENGINES", "ENV", "engine_choice", "release_buffers", "replay_fast", "run_replay", "unsupported"]


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
    slots = cfg.slots
    n = w.n
    nb, pin, extra, oversized = request_budget(w, cfg, capacity)
    u = max(w.n_unique, 1)
    n_pool = max(capacity, 1)
    kv = KVState(slots, w.n_unique, capacity, zeroed=(
        _take("res", (u, slots), np.int8, 0), _take("kf", (slots, u, 2), np.int32, 0),
        _take("sl", (slots, n_pool, 6), np.int32, None)))
    toff = offsets(pin + extra)
    tbl = np.zeros(max(int(toff[-1]), 1), dtype=np.int32)
    kmode, vopts = policy.view(cfg, w.block_size)
    ci, cf, g, fp = cluster(cfg, slots, capacity, serving, w.block_size)
    budget = (3 * n + len(cfg.events) + 1, 3 * int(pin.sum() + extra.sum()) + 1)
    g[L.G_VMODE], (items, dids, dres, last) = view_arrays(kmode, vopts, fp, slots, kv.res.shape[1], budget)
    form = compiled_form(policy)
    if form is None:
        raise ValueError(unsupported(policy))
    pa: PolicyArrays = form.setup(policy, w, slots)
    uni = policy.rng(cfg.seed).random(max(n, 1))  # the stream ClusterView.uniform draws, 4096 at a time
    rq, rf = request_rows(w, nb, pin, extra, toff, max_hit_blocks(w, pin))
    cand = np.zeros((max(n, 1), pa.width), dtype=np.int32)
    hcap = min(n, slots * cfg.max_num_seqs) + 1
    ht, hm = np.zeros(hcap), np.zeros((hcap, 3), dtype=np.int64)
    ev_t, ev_a, ev_r = event_arrays(cfg)
    horizon = run(
        pa.code, w.offsets, w.blocks, rq, rf, cand, ci, cf, g, fp, kv.res.T, kv.kf, kv.sl, kv.slf, kv.meta,
        kv.evictions, kv.evict_age_sum, kv.evict_hist, kv.scratch, tbl, items, dids, dres, last, ht, hm,
        pa.pf, pa.pi, pa.sf, pa.si, pa.pu, uni, ev_t, ev_a, ev_r,
    )
    for name, a in (("res", kv.res.T), ("kf", kv.kf), ("sl", kv.sl), ("dres", dres), ("last", last)):
        if a.size > 1:
            _pool[name] = a  # kept for the next replay (replacing whatever was kept under this name)
    reason, reasons = _reasons(rq[:, L.RQ_REASON], pa.reasons)
    cand_n = rq[:, L.RQ_CAND_N]
    cand_off = offsets(cand_n)
    return Outcome(
        policy=policy.name, n_slots=slots, replica=rq[:, L.RQ_REPLICA].astype(np.int32),
        start_s=rf[:, L.RF_START].copy(), first_token_s=rf[:, L.RF_FIRST].copy(),
        finish_s=rf[:, L.RF_FINISH].copy(), cached_tokens=rq[:, L.RQ_CACHED].copy(),
        predicted_cached=rq[:, L.RQ_PREDICTED].copy(), best_cached=rq[:, L.RQ_BEST].copy(),
        routed_cached=rq[:, L.RQ_ROUTED].copy(), routed_blocks=rq[:, L.RQ_ROUTED_K].astype(np.int32),
        prefill_s=rf[:, L.RF_PRE_S].copy(), reason=reason, reasons=reasons,
        cand_ids=cand[:n][np.arange(pa.width) < cand_n[:, None]], cand_off=cand_off,
        evictions=kv.evictions.copy(), evict_age_sum=kv.evict_age_sum.copy(), evict_hist=kv.evict_hist.copy(),
        area_outstanding=cf[L.AREA_OUT].copy(), area_waiting=cf[L.AREA_WAIT].copy(), horizon_s=float(horizon),
        oversized=oversized, knowledge=kmode, extra=pa.stats(pa.sf, pa.si),
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


# Large arrays kept between compiled replays: a replay's KV state and approximate view are [replicas x
# distinct blocks], and faulting in fresh memory for them on every replay costs more than refilling. `_take`
# hands out the array kept from the previous replay (refilled) when its shape and dtype match, else a new
# one; `replay_fast` puts it back afterwards. At most one array per name is kept; `release_buffers()` drops
# them all. An array is out of the pool while a replay uses it, so concurrent replays never share one.
_pool: dict[str, np.ndarray] = {}


def _take(name: str, shape: tuple[int, ...], dtype: type, fill: float | None) -> np.ndarray:
    """An array of this shape and dtype filled with `fill` (None: left as it is, for arrays whose
    entries are written before they are read), reused when the pool holds one."""
    a = _pool.pop(name, None)
    if a is not None and a.shape == shape and a.dtype == dtype:
        if fill is not None:
            a.fill(fill)
        return a
    if fill is None:
        return np.empty(shape, dtype=dtype)
    return np.zeros(shape, dtype=dtype) if fill == 0 else np.full(shape, fill, dtype=dtype)


def release_buffers() -> None:
    """Drop every kept array (frees the memory)."""
    _pool.clear()


# The arrays the compiled replay runs on, built from the workload, config, serving model and view options.
# Each builder fills its arrays exactly as the reference engine initialises the matching state (a fresh
# `ClusterView`, `make_view`, the per-request outcome arrays), in the layout of `layout.py`.
def view_arrays(
    kmode: str, vopts: dict, fp: np.ndarray, slots: int, u: int, budget: tuple[int, int]
) -> tuple[int, tuple[np.ndarray, ...]]:
    """(view mode, (items, ids, delayed resident set, approximate last-routed times)) for
    `make_view(kmode, kv, **vopts)`; fills the view's parameters into `fp`."""
    delay, ttl = float(vopts.get("delay_s", 0.0)), float(vopts.get("ttl_s", 120.0))
    max_blocks, sweep = vopts.get("max_blocks"), vopts.get("sweep_s")
    fp[L.VP_DELAY], fp[L.VP_TTL] = delay, ttl
    fp[L.VP_MAX_BLOCKS] = -1.0 if max_blocks is None else float(max_blocks)
    fp[L.VP_HAS_SWEEP] = sweep is not None
    fp[L.VP_SWEEP] = sweep or 0.0
    fp[L.VP_NEXT_SWEEP] = sweep if sweep else np.inf
    mode = {"exact": L.V_EXACT, "delayed": L.V_DELAYED, "approximate": L.V_APPROX}[view_kind(kmode, delay)]
    items, dids = np.zeros((1, 4)), np.zeros(1, dtype=np.int32)
    dres, last = np.zeros((1, 1), dtype=np.int8), np.zeros((1, 1))
    if mode == L.V_DELAYED:
        # every event is one admission, release or restart, and every id one block allocation (stored
        # or evicted) or one cleared block: the FIFOs never outgrow these bounds
        items, dids = np.zeros((budget[0], 4)), np.zeros(budget[1], dtype=np.int32)
        dres = _take("dres", (u, slots), np.int8, 0)
    elif mode == L.V_APPROX:
        # replica-major (unlike kv.res): routing and expiry walk one replica's row, which outweighs matching
        last = _take("last", (slots, u), np.float64, -np.inf)
    return mode, (items, dids, dres, last)


def event_arrays(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scenario events as (time, action code, replica), in the reference's order (stable by time)."""
    events = sorted(cfg.events, key=lambda e: e.time_s)
    codes = {"restart": L.EV_RESTART, "add": L.EV_ADD, "remove": L.EV_REMOVE}
    return (
        np.array([e.time_s for e in events], dtype=np.float64),
        np.array([codes[e.action] for e in events], dtype=np.int64),
        np.array([e.replica for e in events], dtype=np.int64),
    )


def request_rows(w: Workload, nb: np.ndarray, pin: np.ndarray, extra: np.ndarray, toff: np.ndarray,
                 maxhit: np.ndarray) -> tuple[np.ndarray, ...]:
    """The per-request matrices: inputs in their columns, results initialised as the reference does."""
    n = w.n
    rq = np.zeros((n, L.N_RQ), dtype=np.int64)
    for col, vals in (
        (L.RQ_NB, nb), (L.RQ_PIN, pin), (L.RQ_EXTRA, extra), (L.RQ_PROMPT, w.prompt_tokens),
        (L.RQ_OUT, w.output_tokens), (L.RQ_CAP, w.hit_cap), (L.RQ_NXT, w.next_in_conv),
        (L.RQ_TOFF, toff[:-1]), (L.RQ_MAXHIT, maxhit),
    ):
        rq[:, col] = vals
    rq[:, L.RQ_REPLICA] = -1
    rf = np.zeros((n, L.N_RF))
    rf[:, L.RF_ARRIVAL] = w.arrival_s
    rf[:, [L.RF_START, L.RF_FIRST, L.RF_FINISH]] = np.nan
    return rq, rf


def cluster(cfg: SimConfig, slots: int, capacity: int, serving: ServingModel, block: int) -> tuple[np.ndarray, ...]:
    """(ci, cf, g, fp): counters as a fresh `ClusterView` holds them, globals, the serving model."""
    ci = np.zeros((L.N_CI, slots), dtype=np.int64)
    ci[L.KV_AVAIL] = max(capacity - 1, 0)  # block 0 of every pool is vLLM's null block
    ci[[L.WQ_HEAD, L.WQ_TAIL, L.REC_HEAD, L.REC_TAIL]] = -1
    ci[L.ACTIVE, : cfg.replicas] = 1
    ci[L.ACT, : cfg.replicas] = np.arange(cfg.replicas)
    cf = np.zeros((L.N_CF, slots))
    cf[L.PREV_T] = -np.inf
    g = np.zeros(L.N_G, dtype=np.int64)
    g[L.G_NACT], g[L.G_VERSION], g[L.G_NEXT_ADD] = cfg.replicas, 1, cfg.replicas
    g[L.G_CAPACITY], g[L.G_BLOCK], g[L.G_MAX_SEQS] = capacity, block, cfg.max_num_seqs
    g[L.G_GEN_ON] = cfg.cache_generated
    g[L.G_BATCH] = cfg.batch_prefills
    fp = np.zeros(L.N_FP)
    fp[: L.SV_BUDGET + 1] = (*serving.prefill.coeffs, serving.tpot_s, serving.decode_slowdown, serving.token_budget)
    return ci, cf, g, fp


# Keep numba's on-disk cache honest across modules. numba's `cache=True` checks only the timestamp of the
# file defining a function, so a kernel that calls kernels from another module (the engine calls every
# policy and `kvcache`) would keep stale machine code after those modules change. `guard()` fingerprints
# the sources the compiled replay is built from and, when the fingerprint changes, empties the cache index
# of every kernel they define before first use.
_SIM = Path(__file__).resolve().parent.parent
_done = False


def _sources() -> list[Path]:
    """Every module kernels are compiled from, including constants they freeze (`layout.py`): this package,
    the policies (each holds its kernel), the block pool, the prefill formula and the hit rule's sim form."""
    return sorted([*(_SIM / "fast").glob("*.py"), *(_SIM / "policies").glob("*.py"), _SIM / "kvcache.py",
                   _SIM / "timing.py", _SIM.parent / "reuse" / "hitrule.py"])


def fingerprint() -> str:
    h = hashlib.sha1()
    for p in _sources():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _dispatchers() -> list:
    import importlib
    import pkgutil

    from numba.core.registry import CPUDispatcher

    out = []  # the modules of this package and of the policies, found by path
    for pkg in ("fast", "policies"):
        for mod in pkgutil.walk_packages([str(_SIM / pkg)], f"prefixscan.sim.{pkg}."):
            m = importlib.import_module(mod.name)
            out += [v for v in vars(m).values() if isinstance(v, CPUDispatcher) and v.__module__ == m.__name__]
    return out


def guard() -> None:
    """Flush the compiled replay's numba caches once per process if its sources changed."""
    global _done
    if _done:
        return
    _done = True
    try:
        disps = _dispatchers()
        stamp_dir = Path(disps[0]._cache.cache_path)  # numba has no public API for this
        stamp = stamp_dir / "prefixscan-fast.fingerprint"
        fp = fingerprint()
        if stamp.exists() and stamp.read_text() == fp:
            return
        for d in disps:
            d._cache.flush()
        stamp.write_text(fp)
    except (OSError, AttributeError, IndexError):
        return  # a read-only or unusual cache location: numba's own per-file check still applies
