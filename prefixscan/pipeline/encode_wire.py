"""What the encode stage sends to and from its workers, compactly: message texts once, hash parts once.

Multi-turn chats resend their whole history every turn and tenants share system prompts; the rewritten
requests of one conversation share their history's hashes. Both ends of each pipe keep the same state, so
repeats travel as short keys.
"""

from __future__ import annotations

import weakref
from dataclasses import replace

import numpy as np

from prefixscan.encode.hashing import BytesLRU
from prefixscan.encode.tokenize.base import SegmentMemo
from prefixscan.read.record import Record

INTERN_BYTES = 32 << 20  # message text each worker keeps for `Packer` (characters)
INTERN_MIN = 64  # shorter texts are sent as they are


class Shipper:
    """Sends hash parts across the process boundary without losing their sharing: each array a part is a
    prefix of travels once, under a number, and later parts refer to it by (number, length)."""

    def __init__(self) -> None:
        self._sent: dict[int, int] = {}
        self._next = 0

    def ship(self, parts: list[np.ndarray]) -> list[tuple[int, np.ndarray | None, int]]:
        out: list[tuple[int, np.ndarray | None, int]] = []
        for p in parts:
            base = p if p.base is None else p.base
            if not (isinstance(base, np.ndarray) and base.ndim == 1 and base.dtype == p.dtype
                    and base.ctypes.data == p.ctypes.data):  # not a prefix of its base: send it whole
                base = p
            key = self._sent.get(id(base))
            if key is None:
                key = self._sent[id(base)] = self._next
                self._next += 1
                weakref.finalize(base, self._sent.pop, id(base), None)  # id() is reused once it is freed
                out.append((key, base, len(p)))
            else:
                out.append((key, None, len(p)))
        return out


class Receiver:
    """The other end of `Shipper`: parts as read-only prefix views of the arrays received."""

    def __init__(self) -> None:
        self._arrays: dict[int, np.ndarray] = {}

    def parts(self, shipped: list[tuple[int, np.ndarray | None, int]]) -> list[np.ndarray]:
        out = []
        for key, arr, n in shipped:
            if arr is not None:
                arr.flags.writeable = False
                self._arrays[key] = arr
            out.append(self._arrays[key][:n])
        return out


class Packer:
    """Sends message texts across the process boundary once: a text the worker already holds goes as its
    16-byte key. Multi-turn chats resend their whole history every turn and tenants share system prompts,
    so this cuts what is pickled, piped and unpickled about 5x (a synth chat log: 526 MB -> 112 MB).
    Both ends keep the same byte-bounded LRU and apply the same operations in the same order, so they
    agree on what is held without talking about it."""

    def __init__(self) -> None:
        self._held = BytesLRU(INTERN_BYTES)

    def pack(self, r: Record) -> Record:
        if not r.messages:
            return r
        msgs, changed = [], False
        for m in r.messages:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str) and len(c) >= INTERN_MIN:
                key = SegmentMemo.key(c)
                if self._held.get(key) is None:
                    self._held.put(key, True, len(c))
                else:
                    m = {**m, "content": key}
                    changed = True
            msgs.append(m)
        return replace(r, messages=msgs) if changed else r


class Unpacker:
    """The worker's end of `Packer`: restores each keyed text from its copy of the LRU."""

    def __init__(self) -> None:
        self._held = BytesLRU(INTERN_BYTES)

    def unpack(self, r: Record) -> Record:
        for m in r.messages or ():
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, bytes):
                text = self._held.get(c)
                if text is None:  # cannot happen while both ends apply the same operations
                    raise RuntimeError("encode worker: a message text it should hold is missing")
                m["content"] = text
            elif isinstance(c, str) and len(c) >= INTERN_MIN:
                self._held.put(SegmentMemo.key(c), c, len(c))
        return r
