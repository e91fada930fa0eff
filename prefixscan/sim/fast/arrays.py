"""The arrays the compiled replay runs on, built from the workload, config, serving model and view options.

Each builder fills its arrays exactly as the reference engine initialises the matching state (a fresh
`ClusterView`, `make_view`, the per-request outcome arrays), in the layout of `layout.py`.
"""

from __future__ import annotations

import numpy as np

from prefixscan.sim.config import SimConfig
from prefixscan.sim.fast import buffers
from prefixscan.sim.fast import layout as L
from prefixscan.sim.timing import ServingModel
from prefixscan.sim.workload import Workload


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
    if kmode == "exact" or (kmode == "delayed" and delay == 0):
        mode = L.V_EXACT
    elif kmode == "delayed":
        mode = L.V_DELAYED
    elif kmode == "approximate":
        mode = L.V_APPROX
    else:
        raise ValueError(f"unknown knowledge mode {kmode!r}")
    items, dids = np.zeros((1, 4)), np.zeros(1, dtype=np.int32)
    dres, last = np.zeros((1, 1), dtype=np.int8), np.zeros((1, 1))
    if mode == L.V_DELAYED:
        # every event is one admission, release or restart, and every id one block allocation (stored
        # or evicted) or one cleared block: the FIFOs never outgrow these bounds
        items, dids = np.zeros((budget[0], 4)), np.zeros(budget[1], dtype=np.int32)
        dres = buffers.take("dres", (u, slots), np.int8, 0)
    elif mode == L.V_APPROX:
        # replica-major (unlike kv.res): routing and expiry walk one replica's row, which outweighs matching
        last = buffers.take("last", (slots, u), np.float64, -np.inf)
    return mode, (items, dids, dres, last)


def events(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    pm = serving.prefill
    fp = np.zeros(L.N_FP)
    fp[: L.SV_BUDGET + 1] = (
        pm.a, pm.b_new, pm.c_cached, pm.d_new_cached, pm.e_new2, serving.tpot_s, serving.decode_slowdown,
        serving.token_budget,
    )
    return ci, cf, g, fp
