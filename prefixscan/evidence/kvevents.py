"""vLLM (and SGLang) KV-cache events: decode the ZMQ wire format, record it, and read it back.

Wire format (docs/engines.md, 'What the engine reports'): a PUB socket sends multipart messages
(topic, sequence number as 8 bytes big-endian, msgpack payload). The payload is an `EventBatch` (ts,
events, data_parallel_rank), encoded as an array in recent versions and as a map in others; each event is
a tagged struct, a map with `type` = BlockStored | BlockRemoved | AllBlocksCleared or an array whose first
item is the tag. Block hashes are ints (the low 64 bits of the digest, big-endian, which is vLLM's
default) or raw digest bytes, which are reduced the same way, so they join with `--hash vllm:...` runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from prefixscan.errors import InputError
from prefixscan.schema import fields

MASK64 = (1 << 64) - 1
KINDS = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
# Field order of the array form of each event (vLLM's struct declaration order), after the tag.
FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                    "lora_name", "extra_keys", "group_idx"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}
SCHEMA = pa.schema(fields("seq:int64 ts:float64 dp_rank:int32 index:int32 kind:string block_hashes:list<uint64> "
                          "parent_block_hash:uint64 block_size:int32 tokens:int64 medium:string lora_name:string"))
GAPS_SCHEMA = pa.schema(fields("after_seq:int64 next_seq:int64 missing:int64 recovered:bool"))


def block_hash(value: Any) -> int:
    """A wire block hash as vLLM's int form: low 64 bits of the big-endian digest."""
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big") & MASK64
    if isinstance(value, int) and not isinstance(value, bool):
        return value & MASK64
    raise ValueError(f"a block hash must be bytes or an int, not {type(value).__name__}")


@dataclass(frozen=True)
class Event:
    """One KV event, normalised."""

    kind: str
    block_hashes: tuple[int, ...] = ()
    parent_block_hash: int | None = None
    block_size: int | None = None
    tokens: int | None = None
    medium: str | None = None
    lora_name: str | None = None


def _event(raw: Any) -> Event:
    if isinstance(raw, dict):
        kind, f = raw.get("type"), raw
    elif isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        kind = raw[0]
        f = dict(zip(FIELDS.get(kind, ()), raw[1:], strict=False))
    else:
        raise ValueError("an event is neither a tagged map nor a tagged array")
    if kind not in KINDS:
        raise ValueError(f"unknown event type {kind!r}")
    parent = f.get("parent_block_hash")
    tokens = f.get("token_ids")
    return Event(kind, tuple(block_hash(h) for h in f.get("block_hashes") or ()),
                 None if parent is None else block_hash(parent), f.get("block_size"),
                 None if tokens is None else len(tokens), f.get("medium"), f.get("lora_name"))


@dataclass(frozen=True)
class Batch:
    """One published message: its sequence number, time, data-parallel rank and events."""

    seq: int
    ts: float
    dp_rank: int | None
    events: tuple[Event, ...]


def decode(seq_bytes: bytes, payload: bytes) -> Batch:
    """Decode one (sequence, payload) pair; ValueError on anything that is not an event batch."""
    import msgpack

    if len(seq_bytes) != 8:
        raise ValueError(f"sequence frame has {len(seq_bytes)} bytes, expected 8")
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ValueError(f"payload is not msgpack ({type(exc).__name__})") from None
    if isinstance(body, dict):
        ts, events, rank = body.get("ts"), body.get("events"), body.get("data_parallel_rank")
    elif isinstance(body, list | tuple) and len(body) >= 2:
        ts, events, rank = body[0], body[1], body[2] if len(body) > 2 else None
    else:
        raise ValueError("payload is not an event batch")
    if not isinstance(ts, int | float) or not isinstance(events, list):
        raise ValueError("event batch lacks ts or events")
    return Batch(seq, float(ts), rank if isinstance(rank, int) else None, tuple(_event(e) for e in events))


@dataclass
class Recording:
    """Batches in arrival order plus what went missing: sequence gaps, and whether replay filled them."""

    batches: list[Batch] = field(default_factory=list)
    gaps: list[tuple[int, int, bool]] = field(default_factory=list)  # (after seq, next seq, recovered)
    bad_messages: int = 0

    def add(self, batch: Batch) -> None:
        if self.batches and batch.seq > self.batches[-1].seq + 1:
            self.gaps.append((self.batches[-1].seq, batch.seq, False))
        self.batches.append(batch)

    def tables(self) -> tuple[pa.Table, pa.Table]:
        return events_table(self.batches), pa.Table.from_pylist(
            [{"after_seq": a, "next_seq": b, "missing": b - a - 1, "recovered": r} for a, b, r in self.gaps],
            schema=GAPS_SCHEMA)


def events_table(batches: Iterable[Batch]) -> pa.Table:
    """One row per event, in sequence order."""
    rows = [{"seq": b.seq, "ts": b.ts, "dp_rank": b.dp_rank, "index": i, "kind": e.kind,
             "block_hashes": list(e.block_hashes), "parent_block_hash": e.parent_block_hash,
             "block_size": e.block_size, "tokens": e.tokens, "medium": e.medium, "lora_name": e.lora_name}
            for b in batches for i, e in enumerate(b.events)]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def read_events(path: str | os.PathLike[str]) -> pa.Table:
    """An events table written by `record-events` (Parquet), checked for the columns the join needs."""
    import pyarrow.parquet as pq

    try:
        t = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read KV events file {path}: {str(exc).splitlines()[0]}") from None
    missing = [c for c in ("seq", "kind", "block_hashes") if c not in t.column_names]
    if missing:
        raise InputError(f"{path} is not a prefixscan KV events file (missing {', '.join(missing)}); "
                         "record one with `prefixscan record-events`")
    return t


def replay_batches(frames: Iterator[tuple[bytes, bytes]]) -> Iterator[Batch]:
    """Batches from a replay endpoint's (seq, payload) replies, up to the end marker (seq -1)."""
    for seq_bytes, payload in frames:
        if int.from_bytes(seq_bytes, "big", signed=True) == -1:
            return
        yield decode(seq_bytes, payload)
