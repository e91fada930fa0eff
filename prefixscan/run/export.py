"""`prefixscan export RUN --to mooncake|bailian`: an anonymised hashed trace that replay tools take
(docs/export.md).

The run's block hashes are chained prefix hashes, so the run hash that ends a target block names the
whole prefix: coarsening to the target's block size (16 -> 512) is exact. The last, partial block is
named by the run's hash of the prompt's end when there is one, else gets an id of its own (which can
only under-state reuse, by one block). Ids are renumbered in first-seen order and timestamps made
relative, so nothing of the original hashes, ids, tenants or text leaves the run. The result carries
the reuse at the run's own block size beside the target's, and `warning` says so when the export keeps
less than half of it; `rate_scale` divides the timestamps (the same requests at a higher rate).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow.compute as pc

from prefixscan.errors import UsageError
from prefixscan.run.atomic import refuse_existing
from prefixscan.run.load import load_run
from prefixscan.run.rundir import run_containing

if TYPE_CHECKING:
    import pyarrow as pa

FORMATS = {"mooncake": 512, "bailian": 16}  # target -> the block size its tooling expects
COLUMNS = ["arrival_s", "prompt_tokens", "output_tokens", "block_hashes", "conversation_id", "turn_index",
           "category"]


@dataclass(frozen=True)
class ExportResult:
    """What was written, and the reuse the written trace carries (so a replay can be checked against it)."""

    path: str
    target: str
    block_size: int
    requests: int
    ids: int
    own_tail_ids: int  # partial last blocks that got an id of their own (reuse there is not kept)
    request_mean: float  # mean over requests of leading ids seen before / ids (AIPerf's "theoretical hit rate")
    block_weighted: float  # leading ids seen before / all ids
    run_block_size: int = 0  # the run's own block size ...
    run_block_request_mean: float = 0.0  # ... and the trace's mean per-request reuse at it
    rate_scale: float = 1.0  # timestamps were divided by this

    @property
    def warning(self) -> str | None:
        """One line when the target block size keeps less than half of the reuse the run's own blocks have."""
        lost = self.run_block_request_mean - self.request_mean
        if lost < 0.05 or self.request_mean >= self.run_block_request_mean / 2:
            return None
        return (f"at {self.block_size}-token blocks the trace keeps a reuse of {self.request_mean:.4f} (mean per "
                f"request) against {self.run_block_request_mean:.4f} at the run's own {self.run_block_size}-token "
                f"blocks (most prompts end inside a shared block); pass --block-size {self.run_block_size} to keep "
                "it, and replay with that block size")

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "warning": self.warning}


def _target_ids(hashes: np.ndarray, n: int, k: int, run_block: int,
                listed_partial: bool) -> tuple[list[int | None], bool]:
    """The request's target-block ids as run hashes (None: the tail needs an id of its own)."""
    full_target = n // (run_block * k)
    ids: list[int | None] = [int(hashes[(j + 1) * k - 1]) for j in range(full_target)]
    if n % (run_block * k) == 0:
        return ids, False
    ends_on_listed = listed_partial or n % run_block == 0
    if ends_on_listed and len(hashes):
        ids.append(int(hashes[-1]))
        return ids, False
    ids.append(None)
    return ids, True


def renumber(rows: list[list[int | None]]) -> list[list[int]]:
    """Ids 0, 1, 2, ... in first-seen order; each None becomes a new id used once."""
    names: dict[int, int] = {}
    nxt = 0
    out = []
    for row in rows:
        new = []
        for h in row:
            if h is None:
                new.append(nxt)
                nxt += 1
                continue
            got = names.get(h)
            if got is None:
                got = names[h] = nxt
                nxt += 1
            new.append(got)
        out.append(new)
    return out


def trace_reuse(rows: list[list[int]]) -> tuple[float, float]:
    """(mean per-request, block-weighted) share of leading ids seen in earlier requests, unbounded cache."""
    seen: set[int] = set()
    fracs, hit, total = [], 0, 0
    for row in rows:
        k = 0
        while k < len(row) and row[k] in seen:
            k += 1
        seen.update(row)
        fracs.append(k / len(row) if row else 0.0)
        hit += k
        total += len(row)
    return (float(np.mean(fracs)) if fracs else 0.0, hit / total if total else 0.0)


def _conversation_fields(conv: list[Any], turns: list[Any]) -> list[tuple[int, int]]:
    """(chat_id's parent or -1, turn) per request, from conversation ids in log order."""
    last: dict[str, int] = {}
    count: dict[str, int] = {}
    out = []
    for i, (c, t) in enumerate(zip(conv, turns, strict=True)):
        if c is None:
            out.append((-1, int(t) if t is not None else 1))
            continue
        parent = last.get(c, -1)
        count[c] = count.get(c, 0) + 1
        last[c] = i
        out.append((parent, int(t) if t is not None else count[c]))
    return out


def _records(target: str, t: pa.Table, ids: list[list[int]], rate_scale: float = 1.0) -> list[bytes]:
    """One JSON line per request; times relative to the first arrival, divided by `rate_scale`."""
    t0 = min((a for a in t.column("arrival_s").to_pylist() if a is not None), default=0.0)
    arrival = [t0 + (a - t0) / rate_scale for a in t.column("arrival_s").to_pylist()]
    n = t.column("prompt_tokens").to_pylist()
    out_tok = [o or 0 for o in t.column("output_tokens").to_pylist()]
    if target == "mooncake":
        return [orjson.dumps({"timestamp": int(round((a - t0) * 1000)), "input_length": ni, "output_length": oi,
                              "hash_ids": h}) for a, ni, oi, h in zip(arrival, n, out_tok, ids, strict=True)]
    conv = _conversation_fields(t.column("conversation_id").to_pylist(), t.column("turn_index").to_pylist())
    cats = t.column("category").to_pylist()
    return [orjson.dumps({"chat_id": i, "parent_chat_id": p, "timestamp": round(a - t0, 6), "input_length": ni,
                          "output_length": oi, "type": c or "text", "turn": turn, "hash_ids": h})
            for i, (a, ni, oi, h, (p, turn), c) in enumerate(zip(arrival, n, out_tok, ids, conv, cats, strict=True))]


def _check_output(out: Path, force: bool) -> None:
    if out.is_dir():
        raise UsageError(f"{out} is a directory; give a file name such as trace.jsonl")
    refuse_existing(out, force)
    run = run_containing(out.parent)
    if run is not None:
        raise UsageError(f"{run} is a run directory; write the export outside it")


def export_trace(run_dir: str | os.PathLike[str], output: str | os.PathLike[str], target: str = "mooncake",
                 block_size: int | None = None, force: bool = False, rate_scale: float = 1.0) -> ExportResult:
    """Write the run's requests as a Mooncake or bailian trace; returns what the trace carries.
    `rate_scale` F divides every timestamp by F (2 = the same requests at twice the rate)."""
    if target not in FORMATS:
        raise UsageError(f"--to must be one of {', '.join(FORMATS)}")
    if not rate_scale > 0 or rate_scale == float("inf"):
        raise UsageError(f"--rate-scale must be a positive number (2 = twice the request rate), not {rate_scale}")
    out = Path(output)
    _check_output(out, force)
    run = load_run(run_dir)
    config = run.manifest.get("config") or {}
    run_block = int(config.get("block_size") or 0)
    tb = int(block_size or FORMATS[target])
    if run_block <= 0 or tb % run_block:
        raise UsageError(f"the target block size {tb} must be a multiple of the run's block size {run_block}")
    t = run.table("requests").select(COLUMNS)
    t = t.take(pc.sort_indices(t, [("arrival_s", "ascending")]))  # stable: log order among equal times
    listed_partial = config.get("hit_rule") == "trace"
    hashes = t.column("block_hashes").to_numpy(zero_copy_only=False)
    ids, own = _ids(hashes, t.column("prompt_tokens").to_pylist(), tb // run_block, run_block, listed_partial)
    _write_lines(out, _records(target, t, ids, rate_scale))
    mean, blocks = trace_reuse(ids)
    own_mean = mean if tb == run_block else trace_reuse(
        _ids(hashes, t.column("prompt_tokens").to_pylist(), 1, run_block, listed_partial)[0])[0]
    return ExportResult(str(out), target, tb, len(ids), sum(map(len, ids)), own, mean, blocks, run_block, own_mean,
                        rate_scale)


def _ids(hashes: np.ndarray, prompts: list[Any], k: int, run_block: int,
         listed_partial: bool) -> tuple[list[list[int]], int]:
    """(renumbered target-block ids per request, partial last blocks that got an id of their own)."""
    rows, own = [], 0
    for h, n in zip(hashes, prompts, strict=True):
        row, fresh = _target_ids(np.asarray(h), int(n), k, run_block, listed_partial)
        rows.append(row)
        own += fresh
    return renumber(rows), own


def _write_lines(out: Path, lines: list[bytes]) -> None:
    from prefixscan.run.atomic import open_atomic

    with open_atomic(out, "wb") as f:  # temporary name, then rename: never a partial trace
        for line in lines:
            f.write(line + b"\n")
