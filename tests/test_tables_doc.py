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
    docs = documented()
    for path in sorted(run.glob("*.parquet")):
        cols = set(pq.read_schema(path).names)
        assert path.stem in docs, f"table {path.stem} is not documented in docs/tables.md"
        assert cols == docs[path.stem], f"{path.stem}: undocumented {cols - docs[path.stem]}, " \
                                        f"stale {docs[path.stem] - cols}"
