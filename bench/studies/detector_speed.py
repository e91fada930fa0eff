"""The findings detector alone (issue 15): per-request cost of `Detector.feed`.

Reads the chat records of each log once (the pipeline's reader), then feeds them, in input order, to
`prefixscan.detect.Detector` `--repeat` times; reports the best CPU time (process time, so a loaded machine
skews it less than wall time would), microseconds per request, and the size of the detector's state. (The
frozen pre-fast-path detector it was once timed against is gone: tests/test_detect_fast.py holds the
detector to that detector's findings through a fixture.)

    .venv/bin/python bench/studies/detector_speed.py LOG [LOG...] [--repeat 3]
    .venv/bin/python bench/studies/detector_speed.py --synth chat:12000 --synth all:3000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from prefixscan.config import AnalyzeConfig  # noqa: E402
from prefixscan.detect import Detector  # noqa: E402
from prefixscan.pipeline.read import Reader  # noqa: E402
from prefixscan.read.sources import expand  # noqa: E402


def chat_records(path: str) -> list[Any]:
    """The accepted chat records of a log, in input order, as the encode stage hands them to the detector."""
    out = []
    for ev in Reader(AnalyzeConfig((path,)), expand([path]), 512).events():
        if isinstance(ev, list):
            out.extend(r for r in ev if r.kind == "chat" and r.messages)
    return out


def feed(cls: type, records: list[Any], block_size: int) -> tuple[float, float, Any]:
    """(CPU seconds, wall seconds, detector) of feeding every record once to a new detector."""
    gc.collect()
    det = cls(block_size)
    c0, w0 = time.process_time(), time.perf_counter()
    for i, r in enumerate(records):
        det.feed(r, i & 7)  # the namespace root is only stored, never compared
    return time.process_time() - c0, time.perf_counter() - w0, det


def measure(name: str, records: list[Any], repeat: int, block_size: int = 16) -> dict[str, Any]:
    cpu_s, wall_s = [], []
    for _ in range(repeat):
        cpu, wall, det = feed(Detector, records, block_size)
        cpu_s.append(cpu)
        wall_s.append(wall)
    n = max(len(records), 1)
    return {
        "log": name, "chat_records": len(records), "repeat": repeat, "cpu_s": round(min(cpu_s), 3),
        "wall_s": round(min(wall_s), 3), "us_per_request": round(1e6 * min(cpu_s) / n, 1),
        "pending_rewrites": len(det.pending), "accumulators": len(det.accs),
        "families": len(det.index.families), "detector_errors": det.errors,
    }


def synth_log(spec: str, out_dir: str) -> str:
    """`scenario:requests` -> a default `prefixscan synth` log of that scenario (breakers on)."""
    from prefixscan.synth import SynthConfig, write

    scenario, n = spec.split(":")
    path = os.path.join(out_dir, f"synth_{scenario}_{n}.jsonl")
    scen = () if scenario == "all" else ((scenario, 1.0),)
    write(SynthConfig(requests=int(n), **({"scenarios": scen} if scen else {})), path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="*")
    ap.add_argument("--synth", action="append", default=[], help="scenario:requests, e.g. chat:12000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (cpus {os.cpu_count()})", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        logs = [*args.logs, *(synth_log(s, tmp) for s in args.synth)]
        for log in logs:
            row = measure(os.path.basename(log), chat_records(log), args.repeat)
            print(json.dumps(row), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
