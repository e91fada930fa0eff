"""A crafted or damaged run directory (issue 28): everything read from the manifest is checked before use
(simulation and table names, directories inside the run, file modes, value types), and a damaged requests
table is one line with exit 5; nothing outside the run is deleted, written or chmod-ed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from tests.conftest import chat, write_jsonl

runner = CliRunner()


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("valid")
    log = write_jsonl(d / "log.jsonl", [chat(i, f"c{i % 5}", 1 + i // 5) for i in range(15)])
    run = d / "run"
    assert runner.invoke(app, ["analyze", str(log), "-o", str(run), "-q"]).exit_code == 0
    assert runner.invoke(app, ["simulate", str(run), "-n", "2", "-p", "round_robin", "-q"]).exit_code == 0
    return run


@pytest.fixture
def run(base_run: Path, tmp_path: Path) -> Path:
    r = tmp_path / "inside" / "run"
    shutil.copytree(base_run, r)
    return r


def edit(run: Path, change) -> None:
    m = json.loads((run / "manifest.json").read_text())
    change(m)
    (run / "manifest.json").write_text(json.dumps(m))


def one_line_exit_5(r) -> None:
    assert r.exit_code == 5, r.output
    assert len(r.output.strip().splitlines()) == 1 and r.output.startswith("prefixscan: error: "), r.output
    assert "internal error" not in r.output and "Traceback" not in r.output


COMMANDS = (["simulate", "{run}", "-n", "2", "-p", "round_robin", "-q"], ["report", "{run}", "-q"],
            ["estimate", "{run}", "--no-save", "-q"], ["query", "{run}", "select 1"], ["simulate", "{run}", "--list"],
            ["simulate", "{run}", "--load", "-q"])


def each_command(run: Path) -> list:
    return [runner.invoke(app, [a.format(run=run) for a in cmd]) for cmd in COMMANDS]


def test_simulation_table_names_cannot_leave_the_run(run: Path, tmp_path: Path) -> None:
    """`{"../victim": 1}` as a simulation's table list: refused; ../victim.parquet survives every command."""
    victim = run.parent / "victim.parquet"
    victim.write_bytes(b"keep me")
    for tables in ({"../victim": 1}, {"sim_x/../../victim": 1}, {"sim_policies": "1"}, ["sim_policies"]):
        edit(run, lambda m, t=tables: m["simulations"]["default"].__setitem__("tables", t))
        for r in each_command(run):
            one_line_exit_5(r)
        assert victim.read_bytes() == b"keep me"
    # the layout before per-simulation directories: the names listed in `tables`
    edit(run, lambda m: (m.pop("simulations"), m.__setitem__("simulate", {"config": {}, "workload": {},
                                                                         "policies": {}}),
                         m["tables"].__setitem__("../victim", {"rows": 1, "stage": "simulate"})))
    for r in each_command(run):
        one_line_exit_5(r)
    assert victim.read_bytes() == b"keep me"


@pytest.mark.parametrize("where", ["../../outside", "/tmp", "simulations/default@1/../../..", "simulations/other@1",
                                   "simulations", "", 5])
def test_simulation_directories_stay_in_simulations(run: Path, where) -> None:
    """A simulation's `dir` must be simulations/NAME@N of its own name (the old default alone: the top)."""
    outside = run.parent.parent / "outside"
    outside.mkdir()
    (outside / "sim_policies.parquet").write_bytes(b"keep me")
    edit(run, lambda m: (m["simulations"].__setitem__("x", {**m["simulations"]["default"], "dir": where})))
    for r in each_command(run):
        one_line_exit_5(r)
    assert (outside / "sim_policies.parquet").read_bytes() == b"keep me"


def test_a_symlinked_simulations_directory_is_refused(run: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    shutil.move(run / "simulations", outside)
    (run / "simulations").symlink_to(outside)
    r = runner.invoke(app, ["simulate", str(run), "-n", "2", "-p", "round_robin", "-q"])
    one_line_exit_5(r)
    assert "symbolic link" in r.output
    assert sorted(p.name for p in outside.iterdir()) == ["default@1"]


@pytest.mark.parametrize("mode", ["7777", "4644", "0777", "1666", "0755", "abc", "", "06440", 420])
def test_file_mode_must_be_read_write_bits(run: Path, mode) -> None:
    """`file_mode` beyond 0666 (setuid, sticky, x bits) or not octal text: refused, no file chmod-ed."""
    edit(run, lambda m: m.__setitem__("file_mode", mode))
    before = {p: p.stat().st_mode for p in run.rglob("*")}
    for r in each_command(run):
        one_line_exit_5(r)
    assert {p: p.stat().st_mode for p in run.rglob("*")} == before


def test_sane_file_modes_still_apply(run: Path) -> None:
    edit(run, lambda m: m.__setitem__("file_mode", "0600"))
    assert runner.invoke(app, ["simulate", str(run), "-n", "2", "-p", "round_robin", "-q"]).exit_code == 0
    assert {oct(p.stat().st_mode & 0o7777) for p in run.rglob("*.parquet")} == {"0o600"}


def test_a_recorded_report_output_is_not_followed(run: Path, tmp_path: Path) -> None:
    """A manifest's recorded config naming an output (or --force) does not make `report` write there."""
    target = tmp_path / "elsewhere"
    edit(run, lambda m: m.__setitem__("project_config", {"path": "x.toml", "sections": {
        "report": {"output": str(target), "fmt": "md"}, "simulate": {"force": True}}}))
    r = runner.invoke(app, ["report", str(run), "-q"])
    assert r.exit_code == 0, r.output
    assert not target.exists() and (run / "report.md").exists() and not (run / "report.html").exists()
    edit(run, lambda m: m.__setitem__("project_config", {"path": "x.toml", "sections": ["report"]}))
    one_line_exit_5(runner.invoke(app, ["report", str(run), "-q"]))


WRONG_TYPES = [
    lambda m: m.__setitem__("simulations", "default"),
    lambda m: m.__setitem__("simulations", {"default": []}),
    lambda m: m["simulations"]["default"].__setitem__("seq", "1"),
    lambda m: m["simulations"]["default"].__setitem__("config", [1]),
    lambda m: m["simulations"]["default"].pop("policies"),
    lambda m: m["simulations"]["default"].__setitem__("policies", {"round_robin": 3}),
    lambda m: m["simulations"].__setitem__("../x", m["simulations"]["default"]),
    lambda m: m.__setitem__("simulate", "yes"),
    lambda m: m.__setitem__("tables", ["requests"]),
    lambda m: m["tables"].__setitem__("requests", 3),
    lambda m: m.__setitem__("config", "x"),
    lambda m: m["config"].__setitem__("block_size", "16"),
    lambda m: m.__setitem__("analyze", []),
    lambda m: m["analyze"].__setitem__("summary", "x"),
    lambda m: m["analyze"]["summary"].__setitem__("capacity", 5),
    lambda m: m["analyze"].__setitem__("requests", {"rejects_by_reason": []}),
    lambda m: m.__setitem__("inputs", "log.jsonl"),
    lambda m: m.__setitem__("command_line", ["x"]),
]


@pytest.mark.parametrize("change", range(len(WRONG_TYPES)))
def test_manifest_values_of_the_wrong_type(run: Path, change: int) -> None:
    edit(run, WRONG_TYPES[change])
    for r in each_command(run):
        one_line_exit_5(r)
        assert "run directory damaged" in r.output


def _flip_data_page(path: Path) -> None:
    """Flip bytes inside the prompt_tokens column chunk (every command reads it), leaving the footer intact
    (a column a command does not read is not checked by it)."""
    meta = pq.ParquetFile(path).metadata
    start = meta.row_group(0).column(meta.schema.names.index("prompt_tokens")).data_page_offset
    b = bytearray(path.read_bytes())
    for i in range(start + 8, min(start + 64, len(b))):
        b[i] ^= 0xFF
    path.write_bytes(bytes(b))


def _flip_footer(path: Path) -> None:
    """Flip the first bytes of the file's metadata (the footer: schema and row groups)."""
    b = bytearray(path.read_bytes())
    start = len(b) - 8 - int.from_bytes(b[-8:-4], "little")
    for i in range(start, start + 32):
        b[i] ^= 0xFF
    path.write_bytes(bytes(b))


DAMAGE = {
    "empty": lambda p: p.write_bytes(b""),
    "flipped footer": lambda p: _flip_footer(p),
    "flipped data": _flip_data_page,
    "not parquet": lambda p: p.write_text('{"seq": 1}\n'),
    "wrong schema": lambda p: pq.write_table(pa.table({"x": [1, 2]}), p),
    "wrong types": lambda p: pq.write_table(pa.table({"seq": ["a"], "request_id": [1], "arrival_s": ["x"],
                                                      "prompt_tokens": ["y"], "block_hashes": [1]}), p),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_requests_table(run: Path, kind: str) -> None:
    DAMAGE[kind](run / "requests.parquet")
    for cmd in (["simulate", str(run), "-n", "2", "-p", "round_robin", "-q"], ["report", str(run), "-q"],
                ["estimate", str(run), "--no-save", "-q"],
                ["query", str(run), "select sum(prompt_tokens) from requests"], ["explain", str(run), "r1"],
                ["export", str(run), "-o", str(run.parent / "t.jsonl")]):
        r = runner.invoke(app, cmd)
        if kind == "flipped data" and cmd[0] == "query":
            assert r.exit_code in (2, 5) and "internal error" not in r.output  # DuckDB reads the pages itself
            continue
        assert r.exit_code == 5, cmd
        one_line_exit_5(r)
    assert not (run / "report.md").exists() or kind == "flipped data"


def test_lock_message_says_in_use(run: Path) -> None:
    """The lock's one line says the run is in use (exit 5); shown here with a lock held by another process."""
    import subprocess
    import sys

    code = (f"import time; from prefixscan.run.rundir import RunLock; RunLock({str(run)!r}).acquire(); "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    try:
        assert holder.stdout.readline().strip() == "held"
        for cmd in (["simulate", str(run), "-n", "2", "-p", "round_robin", "-q"],
                    ["simulate", str(run), "-n", "2", "-p", "round_robin", "-q", "--name", "other"]):
            r = runner.invoke(app, cmd)
            one_line_exit_5(r)
            assert "is in use" in r.output and f"pid {holder.pid}" in r.output
    finally:
        holder.kill()
        holder.wait()
