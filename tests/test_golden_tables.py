"""Every table of a run, pinned: digests of each table's content on the sample logs (and the shared
Mooncake trace when present), for `analyze` and then `simulate`.

The redesign of issue 29 moved code, never results: these digests were taken before it and must not
move. A deliberate change of a table updates DIGESTS in the same commit and says why
(`python -m tests.test_golden_tables` prints the current ones). The digest is over the schema (names and
types) and the values (floats exactly, via their repr), not the Parquet bytes, so a pyarrow upgrade that
writes other file metadata does not count as a change.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from tests.conftest import MOONCAKE, ROOT

# Inputs by their path from the repository root, where the runs are made: the requests table names its
# source files, so absolute paths would tie the digests to one checkout's place.
RUNS = {
    "demo": ["sample_logs/chat.jsonl", "sample_logs/chat.parquet"],
    "mooncake_small": ["sample_logs/mooncake_small.jsonl"],
    "shared_synthetic": [os.path.relpath(MOONCAKE / "synthetic_trace.jsonl", ROOT)],
}

DIGESTS: dict[str, dict[str, str]] = {
    "demo": {
        "capacity_curve.parquet": "6a809f36ceada85a",
        "finding_requests.parquet": "ba068646019ef6e1",
        "findings.parquet": "09d7775c514ec634",
        "misses.parquet": "3275b32d1d0f91ab",
        "prefixes.parquet": "a62bdfb9281a057f",
        "rejects.parquet": "fd6080297e774da5",
        "requests.parquet": "b9de51db031c3765",
        "simulations/default@1/sim_decisions.parquet": "765d71fdfac5dde6",
        "simulations/default@1/sim_policies.parquet": "81ca515b01c846bf",
        "simulations/default@1/sim_replicas.parquet": "cc24bd681efacdc3",
        "simulations/default@1/sim_timeline.parquet": "13f96e7a92054f4c",
        "summaries.parquet": "44e0c99d0f252c28",
    },
    "mooncake_small": {
        "capacity_curve.parquet": "948e7e7b82c2a3b4",
        "finding_requests.parquet": "e9e439d6fd0f56a1",
        "findings.parquet": "ea73819c7ad7b101",
        "misses.parquet": "d376b8ca401430b5",
        "prefixes.parquet": "d5d6646aef7a2bde",
        "rejects.parquet": "fd6080297e774da5",
        "requests.parquet": "c8bcd35f529a7f8a",
        "simulations/default@1/sim_decisions.parquet": "60067d6d774331c5",
        "simulations/default@1/sim_policies.parquet": "40a8c25ca90e00b2",
        "simulations/default@1/sim_replicas.parquet": "67f153eebb006f45",
        "simulations/default@1/sim_timeline.parquet": "775d9094e78a89ce",
        "summaries.parquet": "c33561c460412b2c",
    },
    "shared_synthetic": {
        "capacity_curve.parquet": "e1b71b0b26b1a4c4",
        "finding_requests.parquet": "e9e439d6fd0f56a1",
        "findings.parquet": "ea73819c7ad7b101",
        "misses.parquet": "1ab2ea1d12d81ea1",
        "prefixes.parquet": "de8a71242bdb1c83",
        "rejects.parquet": "fd6080297e774da5",
        "requests.parquet": "56278f44eb03927c",
        "simulations/default@1/sim_decisions.parquet": "27a838979b1d193c",
        "simulations/default@1/sim_policies.parquet": "854d5cae88a88fb0",
        "simulations/default@1/sim_replicas.parquet": "b8447dd2d9005633",
        "simulations/default@1/sim_timeline.parquet": "821d5e82f56a24d9",
        "summaries.parquet": "4a596abeb90d5175",
    },
}


def digest(path: Path) -> str:
    """A table's schema and values as one short hash."""
    t = pq.read_table(path).replace_schema_metadata(None)
    payload = json.dumps([[f.name, str(f.type)] for f in t.schema]) + json.dumps(t.to_pydict(), default=repr)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def tables(name: str, out: Path) -> dict[str, str]:
    """Analyze then simulate the run `name` into `out`; the digest of every table written."""
    for args in (["analyze", *RUNS[name], "-o", str(out), "-q"], ["simulate", str(out), "-q"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
    return {p.relative_to(out).as_posix(): digest(p) for p in sorted(out.rglob("*.parquet"))}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_tables_are_unchanged(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if name.startswith("shared") and not MOONCAKE.exists():
        pytest.skip("shared/data/mooncake not present")
    monkeypatch.chdir(ROOT)
    assert tables(name, tmp_path / "run") == DIGESTS[name]


if __name__ == "__main__":  # print today's digests, to paste into DIGESTS after a deliberate change
    import tempfile

    os.chdir(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        now = {n: tables(n, Path(tmp) / n) for n in sorted(RUNS) if not n.startswith("shared") or MOONCAKE.exists()}
    json.dump(now, sys.stdout, indent=4)
