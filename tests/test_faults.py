"""Fault suite: kill -9 mid-run, full disk, read-only target, two writers, `fix` onto its input.

Each case asserts the three promises of issue 13: no traceback (one line naming the path and the fix),
no damaged run (a run directory is complete or absent, the old one survives a failed `--force`), and no
orphaned worker process. The subprocess cases run the real CLI with a moderate synthetic log.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.config import AnalyzeConfig
from prefixscan.errors import EnvError, RunDirError, RunLockedError
from prefixscan.pipeline.run import run_analysis
from prefixscan.run import rundir
from prefixscan.run.rundir import RunLock, lock_path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "prefixscan"]
SAMPLE = str(ROOT / "sample_logs" / "chat.jsonl")
runner = CliRunner()


def _one_line_error(args: list[str], code: int) -> str:
    """Run the CLI in-process; assert it failed with `code` and one line on stderr; return that line."""
    r = runner.invoke(app, args)
    assert r.exit_code == code, (args, r.exit_code, r.stderr, r.exception)
    assert r.stderr.startswith("prefixscan: error: ") and r.stderr.count("\n") == 1, (args, r.stderr)
    assert "Traceback" not in r.output
    return r.stderr


def _assert_complete(run: Path) -> dict:
    """A complete run: a manifest that parses, every table it lists readable, no temporaries inside."""
    manifest = json.loads((run / "manifest.json").read_text())
    for name in manifest["tables"]:
        pq.read_table(run / f"{name}.parquet")
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")], list(run.iterdir())
    return manifest


def _marked(mark: str) -> list[int]:
    """Pids of live processes whose environment carries `mark` (the CLI and its workers)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if mark.encode() in (d / "environ").read_bytes():
                stat = (d / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(d.name))
        except OSError:
            continue
    return pids


def _cli(args: list[str], mark: str, **kw: object) -> subprocess.Popen:
    env = dict(os.environ, PREFIXSCAN_FAULT_MARK=mark, COLUMNS="120")
    return subprocess.Popen([*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


@pytest.fixture(scope="module")
def synth_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "log.jsonl"
    subprocess.run([*CLI, "synth", "-o", str(path), "-n", "250", "--no-truth", "-q"], check=True)
    return path


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find orphaned workers")
def test_kill_9_at_random_points_leaves_a_complete_run_and_no_orphan(synth_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["analyze", str(synth_log), "-o", str(out), "--workers", "1", "-q", "--json"]
    t0 = time.monotonic()
    first = _cli(args, "m0-" + uuid.uuid4().hex)
    assert first.wait(timeout=300) == 0, first.stderr.read()
    full = time.monotonic() - t0
    before = _assert_complete(out)
    rng = random.Random(13)
    for i in range(3):
        mark = f"m{i + 1}-{uuid.uuid4().hex}"
        p = _cli([*args, "--force"], mark)
        time.sleep(rng.uniform(0.15, 1.0) * full)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _marked(mark) == [], f"workers outlived the killed run (kill {i})"
        if out.exists():  # the old run or the new one, complete either way
            _assert_complete(out)
        else:  # only possible without an atomic exchange: the next run restores the old one
            assert sys.platform != "linux"
    last = _cli([*args, "--force"], "m9-" + uuid.uuid4().hex)
    assert last.wait(timeout=300) == 0, last.stderr.read()
    after = _assert_complete(out)
    assert after["tables"].keys() == before["tables"].keys()
    assert [p.name for p in tmp_path.iterdir()] == ["run"], list(tmp_path.iterdir())  # leftovers cleaned


def test_a_second_writer_is_refused_while_the_first_finishes(synth_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = _cli(["analyze", str(synth_log), "-o", str(out), "-q", "--json"], "c1-" + uuid.uuid4().hex)
    deadline = time.monotonic() + 120
    while not lock_path(out).exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, "the first writer ended before the second could try"
    err = _one_line_error(["analyze", SAMPLE, "-o", str(out), "--force", "-q", "--json"], RunLockedError.exit_code)
    assert f"pid {first.pid}" in err and str(lock_path(out)) in err
    assert first.wait(timeout=300) == 0
    manifest = _assert_complete(out)
    assert manifest["inputs"][0]["path"] == str(synth_log)  # the first writer's run, not a mix


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "run"
    lock_path(out).write_text("999999999\n")  # a killed run's lock file: nobody holds the OS lock
    res = run_analysis(AnalyzeConfig(inputs=(SAMPLE,), output=str(out), quiet=True, findings=False))
    assert res.run_dir == str(out) and not lock_path(out).exists()
    with RunLock(out):  # a live holder: another process is refused and told who holds it
        code = f"from prefixscan.run.rundir import RunLock; RunLock({str(out)!r}).acquire()"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert r.returncode != 0 and f"pid {os.getpid()}" in r.stderr


def test_old_leftovers_inside_a_run_never_block_force(tmp_path: Path) -> None:
    """What a killed older version left (`.requests.*.tmp`, `.spill.*`, no manifest) is recognised."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".requests.abc123.tmp").write_bytes(b"partial")
    (out / ".spill.xyz").mkdir()
    (out / ".spill.xyz" / "ids.bin").write_bytes(b"\0" * 8)
    run_analysis(AnalyzeConfig(inputs=(SAMPLE,), output=str(out), force=True, quiet=True, findings=False))
    _assert_complete(out)


def test_a_failed_force_run_keeps_the_old_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    run_analysis(AnalyzeConfig(inputs=(SAMPLE,), output=str(out), quiet=True, findings=False))
    old = (out / "manifest.json").read_bytes()

    def full_disk(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir, "write_parquet", full_disk)
    with pytest.raises(EnvError, match="no space left on the device"):
        run_analysis(AnalyzeConfig(inputs=(SAMPLE,), output=str(out), force=True, quiet=True, findings=False))
    assert (out / "manifest.json").read_bytes() == old
    _assert_complete(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_full_disk_while_the_misses_table_is_written_keeps_the_old_run(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The misses table is written group by group during the detect stage, before the run directory is
    assembled: a failed write there names the run, keeps the old one and leaves no temporary file."""
    out = tmp_path / "run"
    run_analysis(AnalyzeConfig(inputs=(SAMPLE,), output=str(out), quiet=True))
    old = (out / "manifest.json").read_bytes()
    write_group = rundir.write_group

    def full_for_misses(writer: object, rows: object) -> None:
        if "lost_breaker_tokens" in rows.column_names:  # type: ignore[attr-defined]
            raise OSError(errno.ENOSPC, "No space left on device")
        write_group(writer, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(rundir, "write_group", full_for_misses)
    with pytest.raises(EnvError, match="no space left on the device") as err:
        run_analysis(AnalyzeConfig(inputs=(SAMPLE,), output=str(out), force=True, quiet=True))
    assert str(out / "misses.parquet") in str(err.value) and ".tmp" not in str(err.value)
    assert (out / "manifest.json").read_bytes() == old
    _assert_complete(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _limited(args: list[str], max_bytes: int) -> subprocess.CompletedProcess:
    """The CLI with files limited to `max_bytes` (RLIMIT_FSIZE): a write beyond it fails with EFBIG, as on a
    full disk, through every layer (Python, pyarrow, DuckDB) and without root."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return subprocess.run([*CLI, *args], capture_output=True, text=True, preexec_fn=limit, timeout=300)


def test_full_disk_during_analyze_and_simulate_damages_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = _limited(["analyze", SAMPLE, "-o", str(out), "-q", "--json"], 20_000)
    assert r.returncode == EnvError.exit_code and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "larger than the system allows" in r.stderr, r.stderr
    # the run's own name, not its hidden temporary's (the first file over the limit is a working file)
    assert f"cannot write {out}" in r.stderr and ".tmp" not in r.stderr and ".spill" not in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing blocks the corrected re-run
    run_analysis(AnalyzeConfig(inputs=(SAMPLE,), output=str(out), quiet=True))
    good = (out / "manifest.json").read_bytes()
    r = _limited(["simulate", str(out), "--replicas", "2", "-q"], 4_000)
    assert r.returncode == EnvError.exit_code and "Traceback" not in r.stderr, r.stderr
    assert (out / "manifest.json").read_bytes() == good
    _assert_complete(out)


def test_read_only_target_is_one_line(tmp_path: Path) -> None:
    """A target the process may not write. chmod does not stop root, so as root the target is in /proc
    (no directory can be made there); otherwise a chmod 0555 directory."""
    if os.geteuid() == 0:
        target = Path("/proc/prefixscan-test/run")
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        target = ro / "run"
    r = subprocess.run([*CLI, "analyze", SAMPLE, "-o", str(target), "-q"], capture_output=True, text=True)
    assert r.returncode == EnvError.exit_code, r.stderr
    assert r.stderr.startswith("prefixscan: error: ") and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert str(target.parent) in r.stderr


def test_damaged_manifest_or_table_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_analysis(AnalyzeConfig(inputs=(SAMPLE,), output=str(out), quiet=True, findings=False))
    table = out / "summaries.parquet"
    table.write_bytes(table.read_bytes()[:100])
    err = _one_line_error(["report", str(out), "-o", str(tmp_path / "rep")], RunDirError.exit_code)
    assert "summaries.parquet is damaged" in err and "--force" in err
    manifest = out / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:50])
    for args in (["simulate", str(out), "-q"], ["findings", str(out)], ["report", str(out)],
                 ["estimate", str(out)]):
        assert "manifest.json is damaged" in _one_line_error(args, RunDirError.exit_code)


def test_fix_never_writes_over_its_input(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "chat.jsonl"
    log.write_bytes(Path(SAMPLE).read_bytes())
    (tmp_path / "link.jsonl").symlink_to(log)
    os.link(log, tmp_path / "hard.jsonl")
    original = log.read_bytes()
    for args in (["-o", str(log), "--force"], ["-o", str(logs), "--force"], ["-o", str(tmp_path / "link.jsonl"),
                 "--force"], ["-o", str(tmp_path / "hard.jsonl"), "--force"]):
        assert "input" in _one_line_error(["fix", str(log), *args], 2)
    assert "inside the input directory" in _one_line_error(["fix", str(logs), "-o", str(logs / "fixed")], 2)
    assert "input" in _one_line_error(["analyze", str(logs), "-o", str(logs), "--force", "-q"], 2)
    r = subprocess.run([*CLI, "fix", str(log), "-o", str(log), "--force"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1  # the real command line too
    assert log.read_bytes() == original and sorted(p.name for p in logs.iterdir()) == ["chat.jsonl"]


@pytest.fixture(scope="module")
def long_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log whose analysis lasts seconds after its lock appears, so the signal lands mid-run."""
    path = tmp_path_factory.mktemp("faults-long") / "log.jsonl"
    subprocess.run([*CLI, "synth", "-o", str(path), "-n", "4000", "--no-truth", "-q"], check=True)
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_exits_130_and_leaves_nothing(long_log: Path, tmp_path: Path, sig: int) -> None:
    out = tmp_path / "run"
    mark = "i-" + uuid.uuid4().hex
    # a job started in the background by a non-interactive shell inherits SIGINT ignored (so would this
    # child, and Python then never raises KeyboardInterrupt): give it Ctrl-C's default, as a terminal does
    p = _cli(["analyze", str(long_log), "-o", str(out), "--workers", "1", "-q", "--json"], mark,
             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not lock_path(out).exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(sig)
    assert p.wait(timeout=60) == 130
    err = p.stderr.read().decode()
    assert err.startswith("prefixscan: error: interrupted") and err.count("\n") == 1, err
    deadline = time.monotonic() + 10
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _marked(mark) == []
    assert list(tmp_path.iterdir()) == []  # no run, no temporary, no lock


def test_an_unexpected_error_is_one_line_naming_a_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import prefixscan.pipeline.summary as summary_mod  # the run imports its summary stage where it is used

    def broken(*_a: object, **_k: object) -> None:
        raise TypeError("something unforeseen")

    monkeypatch.setattr(summary_mod, "build_summary", broken)
    err = _one_line_error(["analyze", SAMPLE, "-o", str(tmp_path / "run"), "-q"], 1)
    assert "internal error: TypeError: something unforeseen" in err and "bug" in err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("PREFIXSCAN_TRACEBACK", "1")
    r = runner.invoke(app, ["analyze", SAMPLE, "-q"])
    assert isinstance(r.exception, TypeError)


def test_extending_a_run_removes_a_killed_writers_temporaries(tmp_path: Path) -> None:
    import pyarrow as pa

    out = tmp_path / "run"
    run_analysis(AnalyzeConfig(inputs=(SAMPLE,), output=str(out), quiet=True, findings=False))
    (out / ".sim_policies.parquet.0badc0de.prefixscan-tmp").write_bytes(b"half a table")
    (out / ".manifest.json.12345678.prefixscan-tmp").write_bytes(b"{")
    rundir.add_tables(out, {"extra": pa.table({"x": [1, 2]})}, section="test", info={"ok": True})
    manifest = _assert_complete(out)
    assert manifest["tables"]["extra"]["rows"] == 2 and manifest["test"] == {"ok": True}
    assert rundir.run_containing(out / "anything" / "deeper.csv") == out.resolve()
    assert rundir.run_containing(tmp_path) is None
