"""docs/tables.md documents exactly the columns the run directory holds."""

from __future__ import annotations

import re

import pyarrow.parquet as pq

import prefixscan
from tests.conftest import ROOT


def documented() -> dict[str, set[str]]:
    tables: dict[str, set[str]] = {}
    current = None
    for line in (ROOT / "docs" / "tables.md").read_text().splitlines():
        m = re.match(r"^## (\w+)", line)
        if m:
            current = m.group(1)
            tables[current] = set()
            continue
        m = re.match(r"^\| `(\w+)` \|", line)
        if m and current:
            tables[current].add(m.group(1))
    return tables


def test_every_written_column_is_documented(tmp_path, chat_log) -> None:
    from typer.testing import CliRunner

    from prefixscan.cli.app import app

    run = tmp_path / "run"
    prefixscan.analyze(str(chat_log), output=str(run))
    r = CliRunner().invoke(app, ["simulate", str(run), "--replicas", "2", "--policies", "all", "--kv-blocks", "64",
                                 "--compare-isolation", "-q"])
    assert r.exit_code == 0, r.output
    # a second simulation with the options that add columns (KV tiers, disaggregation, the capacity view)
    run2 = tmp_path / "run2"
    prefixscan.analyze(str(chat_log), output=str(run2))
    r = CliRunner().invoke(app, ["simulate", str(run2), "-p", "round_robin", "--kv-blocks", "64",
                                 "--host-kv-blocks", "64", "--shared-kv-blocks", "64", "--prefill-replicas", "1",
                                 "--decode-replicas", "1", "--tier-sweep", "-q"])
    assert r.exit_code == 0, r.output
    docs = documented()
    written: dict[str, set[str]] = {}
    for path in sorted([*run.rglob("*.parquet"), *run2.rglob("*.parquet")]):  # simulations/NAME@N/ too
        written.setdefault(path.stem, set()).update(pq.read_schema(path).names)
    for stem, cols in sorted(written.items()):
        assert stem in docs, f"table {stem} is not documented in docs/tables.md"
        assert cols == docs[stem], f"{stem}: undocumented {cols - docs[stem]}, stale {docs[stem] - cols}"
