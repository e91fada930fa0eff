"""Seconds of py-spy samples by pipeline stage, from a raw collapsed-stacks profile (issue 15).

    python bench/studies/profile_stages.py PROFILE.txt [--rate 100]

PROFILE.txt is `py-spy record --format raw` output (the rows' profiles, `bench/out/profile-*.txt`, sample
every process and thread). Each stack goes to the first stage below whose name appears in one of its
frames; a stack whose running frame is a thread pool's `_WorkItem.run` is a compiled kernel with no Python
frame of its own, which in analyze is the capacity curve's passes. Samples of threads that run at the same
time add up, so the total overstates CPU seconds where threads outnumber the cores. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py

from common import raw_stacks

STAGES = [
    ("capacity curve", ["capacity", "pool_curve", "opt_hits", "lru_pool", "run_chunk", "_opt_chunk"]),
    ("tiktoken itself", ["encode_ordinary"]),
    ("segment plan + assemble", ["SegmentEncoder.plan", "SegmentEncoder.assemble", "_plan_text", "_replay",
                                 "_resume", "SegmentMemo"]),
    ("chain hashing", ["ChainCache", "block_hashes", "chain_hashes"]),
    ("rendering", ["render_chatml", "_message_body"]),
    ("pickling and pipes to and from the worker", ["Packer.pack", "Unpacker", "ForkingPickler", "Connection._send",
                                                   "Connection._recv", "Queue.get", "Queue.put", "Receiver",
                                                   "Shipper"]),
    ("read + JSON parse + normalise", ["read_jsonl", "parse_line", "normalise", "Reader.events"]),
    ("findings detector", ["Detector", "detect/"]),
    ("reuse scan", ["IdealStream", "SeenSet", "RequestStream._process", "DenseTable", "_concat"]),
    ("requests table (Parquet)", ["RowGroups", "write_table", "write_group", "requests_arrow"]),
    ("aggregates, prefixes, attribution", ["aggregates", "prefixes", "summaries", "attribut", "misses"]),
    ("columns", ["EncodeStage._columns", "_snippet", "input_frame"]),
    ("imports and start-up", ["_find_and_load", "load_tiktoken_bpe", "Encoding.__init__", "_compile_for_args",
                              "llvmlite", "_call_with_frames_removed"]),
    ("waits (locks, queues, joins, sleeps)", ["Condition.wait", "lock", "select", "poll", "join", "wait",
                                              "die_with_parent"]),
]


def stage_of(frames: list[str]) -> str:
    if frames and frames[-1].startswith("_WorkItem.run"):
        return "capacity curve"
    for name, keys in STAGES:
        if any(k in f for f in frames for k in keys):
            return name
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("--rate", type=float, default=100.0)
    args = ap.parse_args()
    samples: Counter[str] = Counter()
    for frames, count in raw_stacks(Path(args.profile), skip=("process ", "thread ")):
        samples[stage_of(frames)] += count
    total = sum(samples.values()) or 1
    print(f"| stage | s | % |\n|---|---:|---:|\n| all ({total / args.rate:.2f} s of samples) | | |")
    for name, n in samples.most_common():
        print(f"| {name} | {n / args.rate:.2f} | {100 * n / total:.1f} |")


if __name__ == "__main__":
    main()
