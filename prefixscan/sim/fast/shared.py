"""What every compiled policy shares: the arrays a kernel reads (`PolicyArrays`, built on the Python side),
the cluster-view helpers of `policies/base.py` over arrays, the consistent-hash ring, and the routing-key hash.

Every policy kernel has the signature `kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni,
cand) -> (replica, reason code, predicted cached tokens, candidates written to cand)`: request i (its
block count and prompt tokens), the cluster (`ci`/`cf`/`g`/`fp`, see `layout.py`; the engine has already
put the known matched blocks in ci[KB] and predicted cached tokens in ci[CACHEDV]), and the policy's own
float/int parameters (`pf`, `pi`), float/int state (`sf`, `si`), uint64 keys and ring points (`pu`) and
the seeded uniform stream (`uni`). Unused arrays are one-element dummies, so one dispatch
(`kernel.choose`) serves all. Each policy's kernel lives beside its readable reference, in
`prefixscan/sim/policies/<name>.py`.

Each helper reproduces its reference counterpart's tie rules exactly: `argmin_active` takes the lowest
replica id among equal values (np.argmin), `ranked` is a stable ascending order over the active
replicas (np.argsort kind="stable"), `pick` draws the next uniform of the policy's seeded stream, the
ring walks distinct replicas clockwise like `base.Ring.walk`. Values live in rows of `ci` / `cf`
(`layout.py`) so helpers take the matrix and a row, not a fresh view. The ring's arrays: `ring_policy`.

Routing keys: `policies.base.key_hash` hashes `int.to_bytes(8, "little")` with `xxhash.xxh3_64_intdigest`;
for an 8-byte input XXH3 takes its 4-to-8-byte path (two 32-bit reads, one keyed mix, rrmxmx), written out
in `xxh3_u64` with the default secret's bytes 8..23 (`tests/test_sim_fast_parts.py` checks it against the
xxhash package), so the keys are computed without Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

from prefixscan.sim import timing
from prefixscan.sim.fast import layout as L
from prefixscan.sim.workload import Workload

RING_VER, RING_M, RING_N, RING_VN, RING_OWN, RING_NREQ = 0, 1, 2, 3, 4, 5
RING_HEADER = 6


@njit(cache=True)
def py_max(a, b):
    """Python's max(a, b): a unless b is strictly larger."""
    return b if b > a else a


@njit(cache=True)
def np_max(a, b):
    """np.maximum for two floats: a unless b is larger (NaN in a wins)."""
    return a if a >= b or a != a else b


prefill_ms = njit(cache=True)(timing.prefill_ms)
_step_share = njit(cache=True)(timing.step_share)


@njit(cache=True)
def seconds(fp, new, cached):
    """PrefillModel.seconds: solo prefill seconds for `new` uncached and `cached` tokens."""
    if new <= 0:
        return 0.0
    ms = prefill_ms(fp[L.SV_A], fp[L.SV_B], fp[L.SV_C], fp[L.SV_D], fp[L.SV_E], float(new), float(cached))
    return py_max(ms, 0.0) / 1000.0


@njit(cache=True)
def share(fp, decoding):
    """`timing.step_share` at the serving model's token budget."""
    return _step_share(int(fp[L.SV_BUDGET]), decoding)


@njit(cache=True)
def prefill_s(fp, new, cached, decoding):
    """ServingModel.prefill_s: the solo seconds at the share of the step a prefill gets beside `decoding`."""
    return seconds(fp, new, cached) / share(fp, decoding)


@njit(cache=True)
def backlog(cf, r, now):
    """ClusterView.backlog_s for one replica."""
    return np_max(cf[L.LANE_UNTIL, r] - now, 0.0) + cf[L.QUEUED_PREFILL, r]


@njit(cache=True)
def pick(ci, row, n, uni, g):
    """ClusterView.pick: a seeded uniform choice among the first n replicas of row `row` of ci."""
    if n == 1:
        return ci[row, 0]
    u = uni[g[L.G_UPTR]]
    g[L.G_UPTR] += 1
    return ci[row, int(u * n)]


@njit(cache=True)
def pick_best(cf, row, sign, tol, ci, nact, uni, g):
    """`pick` among the active replicas whose sign * cf[row] is within `tol` of the lowest (the tied ones
    are written to ci[SCR0])."""
    lo = sign * cf[row, ci[L.ACT, 0]]
    for a in range(1, nact):
        lo = min(lo, sign * cf[row, ci[L.ACT, a]])
    nt = 0
    for a in range(nact):
        if sign * cf[row, ci[L.ACT, a]] <= lo + tol:
            ci[L.SCR0, nt] = ci[L.ACT, a]
            nt += 1
    return pick(ci, L.SCR0, nt, uni, g)


@njit(cache=True)
def argmin_active(cf, row, ci, nact):
    """Lowest value of cf[row] among active replicas; ties go to the lowest id."""
    best = ci[L.ACT, 0]
    for a in range(1, nact):
        r = ci[L.ACT, a]
        if cf[row, r] < cf[row, best]:
            best = r
    return best


@njit(cache=True)
def ranked(cf, row, sign, ci, nact, k, out):
    """First k active replicas by ascending sign * cf[row], stable; returns how many were written."""
    m = min(k, nact)
    pv, pp = 0.0, -1
    for j in range(m):
        bi, bv = -1, 0.0
        for p in range(nact):
            v = sign * cf[row, ci[L.ACT, p]]
            if j > 0 and (v < pv or (v == pv and p <= pp)):
                continue  # already ranked
            if bi < 0 or v < bv:
                bi, bv = p, v
        out[j] = ci[L.ACT, bi]
        pv, pp = bv, bi
    return m


@njit(cache=True)
def ring_sync(ci, g, si, pu):
    """Ring.sync: rebuild the sorted virtual-node points when the active set changed."""
    if si[RING_VER] == g[L.G_VERSION]:
        return
    vn, n, own = si[RING_VN], si[RING_NREQ], si[RING_OWN]
    nact = g[L.G_NACT]
    sp, rp = n, n + ci.shape[1] * vn
    m = nact * vn
    pts = np.empty(m, dtype=np.uint64)
    for a in range(nact):
        for v in range(vn):
            pts[a * vn + v] = pu[sp + ci[L.ACT, a] * vn + v]
    order = np.argsort(pts, kind="mergesort")
    for j in range(m):
        pu[rp + j] = pts[order[j]]
        si[own + j] = ci[L.ACT, order[j] // vn]
    si[RING_M] = m
    si[RING_N] = nact
    si[RING_VER] = g[L.G_VERSION]


@njit(cache=True)
def ring_start(ci, si, pu, key):
    """Position of a key on the ring (np.searchsorted side="left")."""
    rp = si[RING_NREQ] + ci.shape[1] * si[RING_VN]
    lo, hi = 0, si[RING_M]
    while lo < hi:
        mid = (lo + hi) // 2
        if pu[rp + mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def ring_owner(ci, si, pu, key):
    """Ring.owner: the first replica clockwise from the key."""
    return si[si[RING_OWN] + ring_start(ci, si, pu, key) % si[RING_M]]


@njit(cache=True)
def ring_next(ci, si, pos, j):
    """Ring.walk step: the j-th point clockwise from pos; -1 if its replica was already yielded.

    Yielded replicas are marked in ci[SCR1]; `ring_unmark` clears them after the walk.
    """
    r = si[si[RING_OWN] + (pos + j) % si[RING_M]]
    if ci[L.SCR1, r]:
        return -1
    ci[L.SCR1, r] = 1
    return r


@njit(cache=True)
def ring_unmark(ci, out, n):
    for j in range(n):
        ci[L.SCR1, out[j]] = 0


@njit(cache=True)
def ring_walk(ci, si, pu, key, limit, out):
    """The first `limit` distinct replicas clockwise from the key; returns how many."""
    pos = ring_start(ci, si, pu, key)
    n = 0
    for j in range(si[RING_M]):
        r = ring_next(ci, si, pos, j)
        if r >= 0:
            out[n] = r
            n += 1
            if n == si[RING_N] or n == limit:
                break
    ring_unmark(ci, out, n)
    return n


_SECRET_8 = np.uint64(0x1CAD21F72C81017C)  # readLE64(kSecret + 8)
_SECRET_16 = np.uint64(0xDB979083E96DD4DE)  # readLE64(kSecret + 16)
_PRIME_MX2 = np.uint64(0x9FB21C651E98DF25)
_LO32 = np.uint64(0xFFFFFFFF)


@njit(cache=True)
def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(cache=True)
def xxh3_u64(value, seed):
    """xxh3_64 of `value` as 8 little-endian bytes, with `seed` (both uint64)."""
    v = np.uint64(value)
    s = np.uint64(seed)
    lo = s & _LO32
    swapped = ((lo & np.uint64(0xFF)) << np.uint64(24)) | ((lo & np.uint64(0xFF00)) << np.uint64(8))
    swapped |= ((lo >> np.uint64(8)) & np.uint64(0xFF00)) | (lo >> np.uint64(24))
    s = s ^ (swapped << np.uint64(32))
    input1 = v & _LO32  # readLE32(input)
    input2 = v >> np.uint64(32)  # readLE32(input + 4)
    bitflip = (_SECRET_8 ^ _SECRET_16) - s
    keyed = (input2 + (input1 << np.uint64(32))) ^ bitflip
    h = keyed ^ (_rotl(keyed, 49) ^ _rotl(keyed, 24))
    h = h * _PRIME_MX2
    h = h ^ ((h >> np.uint64(35)) + np.uint64(8))
    h = h * _PRIME_MX2
    return h ^ (h >> np.uint64(28))


@njit(cache=True)
def xxh3_u64_vec(values, seed, out):
    for j in range(len(values)):
        out[j] = xxh3_u64(values[j], seed)
    return out


def _unused(dtype: type) -> Any:
    """The default of an array a policy does not use: a one-element dummy (one kernel signature for all)."""
    return field(default_factory=lambda: np.zeros(1, dtype=dtype))


@dataclass
class PolicyArrays:
    """One policy's parameters and state for its kernel, plus how to name its reason codes."""

    code: int
    reasons: Callable[[int], str]
    pf: np.ndarray = _unused(np.float64)
    pi: np.ndarray = _unused(np.int64)
    sf: np.ndarray = _unused(np.float64)
    si: np.ndarray = _unused(np.int64)
    pu: np.ndarray = _unused(np.uint64)
    width: int = 3  # most candidates one decision lists
    stats: Callable[[np.ndarray, np.ndarray], dict[str, Any]] = lambda sf, si: {}


def fixed_reasons(names: tuple[str, ...]) -> Callable[[int], str]:
    return lambda code: names[code]


def f64(*vals: float) -> np.ndarray:
    return np.array(vals, dtype=np.float64)


def i64(*vals: int) -> np.ndarray:
    return np.array(vals, dtype=np.int64)


def ring_policy(code: int, reasons: Callable[[int], str], policy: Any, w: Workload, slots: int, key_mode: str,
                state: np.ndarray | None = None, **arrays: Any) -> PolicyArrays:
    """Arrays of a consistent-hash policy (`arrays`: its other `PolicyArrays` fields): request keys, every
    slot's points on the policy's `Ring`, an unbuilt ring.

    `si` = the ring header (version, points, replicas, vnodes, offset of the owners in si, requests), then
    `state` (the policy's own ints, from index RING_HEADER), then the owners of the sorted points; `pu` =
    the per-request keys, every slot's virtual-node points, then the sorted active points.
    """
    vn = policy.ring.vnodes
    keys = request_keys(w, key_mode, policy.params.prefix_blocks)
    state = np.zeros(0, dtype=np.int64) if state is None else state.astype(np.int64)
    head = i64(-1, 0, 0, vn, RING_HEADER + len(state), w.n)
    si = np.concatenate([head, state, np.zeros(slots * vn, dtype=np.int64)])
    pu = np.concatenate([keys, policy.ring.points_of(range(slots)), np.zeros(slots * vn, dtype=np.uint64)])
    return PolicyArrays(code, reasons, si=si, pu=pu, **arrays)


def request_keys(w: Workload, mode: str, prefix_blocks: int) -> np.ndarray:
    """base.request_key for every request at once (the same xxh3 values, compiled)."""
    n = w.n
    nb = np.diff(w.offsets)
    out = np.zeros(n, dtype=np.uint64)
    conv = (w.conv_key != 0) if mode == "conversation" else np.zeros(n, dtype=bool)
    empty = ~conv & (nb == 0)
    pref = ~conv & (nb > 0)
    if conv.any():
        out[conv] = xxh3_u64_vec(w.conv_key[conv], np.uint64(1), np.zeros(int(conv.sum()), dtype=np.uint64))
    if empty.any():
        idx = np.flatnonzero(empty).astype(np.uint64)
        out[empty] = xxh3_u64_vec(idx, np.uint64(3), np.zeros(len(idx), dtype=np.uint64))
    if pref.any():
        pos = w.offsets[:-1][pref] + np.minimum(prefix_blocks, nb[pref]) - 1
        vals = w.block_keys[w.blocks[pos]]
        out[pref] = xxh3_u64_vec(vals, np.uint64(2), np.zeros(len(vals), dtype=np.uint64))
    return out
