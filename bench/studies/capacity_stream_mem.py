"""Peak memory and time of `CapacityStream` on a synthetic stream at the 10M-request trace scale.

    .venv/bin/python bench/studies/capacity_stream_mem.py [--requests 10000000] [--chunk 250000] [--spill DIR]
    .venv/bin/python bench/studies/capacity_stream_mem.py --compare 200000   # equality with capacity_curve

The stream is generated chunk by chunk (never held whole) by a compiled generator with a fixed seed, and
looks like a hashed trace: a request either opens a conversation (a Zipf-popular template prefix, then
new blocks) or continues an earlier request (a prefix of it, then new blocks), about 10 blocks per request
and 2.9 new blocks per request (28-29M distinct over 10M requests). Ids are dense in first-appearance
order, as `prefixscan.encode.dense.dense_ids` would number them. Peak RSS is VmHWM from /proc/self/status.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from numba import njit

from prefixscan.reuse.capacity.lru import capacity_curve
from prefixscan.reuse.capacity.stream import CapacityStream

BLOCK = 512
WINDOW = 1 << 18  # recent requests a continuation may come back to
LONGEST = 16  # blocks per request at most
TEMPLATES = 4000


@njit(cache=True)
def _seed(seed):  # pragma: no cover - compiled
    np.random.seed(seed)


@njit(cache=True)
def _generate(n_req, ring, ring_len, tpl, tpl_len, st):  # pragma: no cover - compiled
    """One chunk of n_req requests: (local offsets, ids, prompt tokens); st = [next id, requests so far]."""
    offsets = np.zeros(n_req + 1, np.int64)
    ids = np.empty(n_req * LONGEST, np.int32)
    prompts = np.empty(n_req, np.int64)
    nb = 0
    for i in range(n_req):
        g = st[1] + i
        row = g % WINDOW
        k = 0
        if g == 0 or np.random.random() < 0.3:  # a new conversation on a popular template
            t = int(TEMPLATES * np.random.random() ** 3)
            for j in range(tpl_len[t]):
                if tpl[t, j] < 0:
                    tpl[t, j] = st[0]
                    st[0] += 1
                ring[row, k] = tpl[t, j]
                k += 1
            fresh = np.random.randint(2, 8)
        else:  # a continuation of a recent request: a prefix of it, then new blocks
            back = 1 + int(np.random.exponential(3000.0))
            src = max(g - min(back, WINDOW - 1), 0) % WINDOW
            n_src = ring_len[src]
            fresh = np.random.randint(1, 4)
            keep = n_src if np.random.random() < 0.6 else np.random.randint(0, n_src + 1)
            keep = min(keep, LONGEST - fresh)
            for j in range(keep):
                ring[row, k] = ring[src, j]
                k += 1
        fresh = min(fresh, LONGEST - k)
        for _ in range(fresh):
            ring[row, k] = st[0]
            st[0] += 1
            k += 1
        ring_len[row] = k
        for j in range(k):
            ids[nb + j] = ring[row, j]
        nb += k
        offsets[i + 1] = nb
        prompts[i] = k * 512 - np.random.randint(0, 512)
    st[1] += n_req
    return offsets, ids[:nb].copy(), prompts


def stream(n_req: int, chunk: int, seed: int):  # a generator of chunks
    """Yield (offsets, ids, prompt tokens) chunks; returns the distinct count through `state[0]` at the end."""
    _seed(seed)
    rng = np.random.default_rng(seed)
    tpl_len = rng.integers(2, 9, size=TEMPLATES).astype(np.int64)
    tpl = np.full((TEMPLATES, 8), -1, np.int64)
    ring = np.zeros((WINDOW, LONGEST), np.int32)
    ring_len = np.zeros(WINDOW, np.int64)
    st = np.zeros(2, np.int64)
    for start in range(0, n_req, chunk):
        yield (*_generate(min(chunk, n_req - start), ring, ring_len, tpl, tpl_len, st), st)


def peak_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run(n_req: int, chunk: int, spill: str, seed: int) -> None:
    _warm_up(spill)
    print(f"after imports and compilation: peak {peak_mib():.0f} MiB")
    t0 = time.perf_counter()
    t_add = 0.0
    blocks = 0
    with CapacityStream(BLOCK, "trace", spill) as cs:
        for offsets, ids, prompts, st in stream(n_req, chunk, seed):
            t = time.perf_counter()
            cs.add(offsets, ids, prompts)
            t_add += time.perf_counter() - t
            blocks += len(ids)
            n_distinct = int(st[0])
        t1 = time.perf_counter()
        print(f"add: {n_req:,} requests, {blocks:,} listed blocks, {n_distinct:,} distinct; "
              f"{t1 - t0:.1f} s (add() {t_add:.1f} s, the rest generation); peak {peak_mib():.0f} MiB")
        table = cs.finish(n_distinct)
    t2 = time.perf_counter()
    print(f"finish: {table.num_rows} capacities; {t2 - t1:.1f} s; peak {peak_mib():.0f} MiB; total {t2 - t0:.1f} s")
    print("capacity_blocks  lru_hit_rate  opt_hit_rate  ideal_hit_rate")
    for r in table.to_pylist():
        print(f"{r['capacity_blocks']:>15,}  {r['lru_hit_rate']:12.4f}  {r['opt_hit_rate']:12.4f}  "
              f"{r['ideal_hit_rate']:14.4f}")


def _warm_up(spill: str) -> None:
    """Compile (or load) every kernel on a tiny stream, so the timings are the work's."""
    with CapacityStream(BLOCK, "trace", spill) as cs:
        state = np.zeros(1, np.int64)
        for offsets, ids, prompts, state in stream(1000, 300, 1):  # noqa: B007 - the last state is used
            cs.add(offsets, ids, prompts)
        cs.finish(int(state[0]), [BLOCK * 10])


def compare(n_req: int, chunk: int, spill: str, seed: int) -> None:
    """CapacityStream over chunks against capacity_curve on the concatenation (default grid and a few
    explicit capacities, with and without OPT)."""
    parts = list(stream(n_req, chunk, seed))
    n_distinct = int(parts[-1][3][0])
    ids = np.concatenate([p[1] for p in parts])
    prompts = np.concatenate([p[2] for p in parts])
    lengths = np.concatenate([np.diff(p[0]) for p in parts])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    for caps, opt in [(None, True), ([0, BLOCK, 100 * BLOCK, 10**12], True), (None, False)]:
        t = time.perf_counter()
        ref = capacity_curve(offsets, ids, prompts, BLOCK, "trace", caps, opt, ids=(ids, n_distinct))
        t1 = time.perf_counter()
        with CapacityStream(BLOCK, "trace", spill, chunk_blocks=1 << 18) as cs:
            for o, i, p, _ in parts:
                cs.add(o, i, p)
            got = cs.finish(n_distinct, caps, opt)
        t2 = time.perf_counter()
        same = got.equals(ref, check_metadata=True)
        print(f"capacities={caps} opt={opt}: equal={same} (capacity_curve {t1 - t:.1f} s, stream {t2 - t1:.1f} s)")
        if not same:
            raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--chunk", type=int, default=250_000, help="requests per add()")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spill", default=None, help="directory for the spill files (default: a temp dir)")
    ap.add_argument("--compare", type=int, default=0, metavar="N", help="check equality on N requests instead")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.spill) as spill:
        if args.compare:
            compare(args.compare, max(1, min(args.chunk, args.compare // 7)), spill, args.seed)
        else:
            run(args.requests, args.chunk, spill, args.seed)


if __name__ == "__main__":
    main()
