"""XXH3-64 of one 8-byte little-endian integer, compiled, so routing keys are computed without Python.

`policies.ring.key_hash` hashes `int.to_bytes(8, "little")` with `xxhash.xxh3_64_intdigest`; for an 8-byte
input XXH3 takes its 4-to-8-byte path (two 32-bit reads, one keyed mix, rrmxmx), written out here with
the default secret's bytes 8..23. `tests/test_sim_fast_parts.py` checks it against the xxhash package.
"""

from __future__ import annotations

import numpy as np
from numba import njit

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
