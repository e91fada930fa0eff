"""Directories and paths (issue 28): nothing in an input directory is passed over without a note, a file
reached by several paths is read once, an existing path wins over glob characters, and a FIFO is named
for what it is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.config import AnalyzeConfig
from prefixscan.errors import InputError
from prefixscan.pipeline.run import run_analysis
from prefixscan.read.sources import expand, walk
from tests.conftest import chat, write_jsonl

runner = CliRunner()


def _log(path: Path, n: int = 6, first: int = 0) -> Path:
    return write_jsonl(path, [chat(first + i, f"c{i % 2}", 1) for i in range(n)])


def _analyze(*paths: Path | str):
    return run_analysis(AnalyzeConfig(inputs=tuple(str(p) for p in paths), quiet=True, findings=False))


def _note(res, words: str) -> str:
    found = [n for n in res.summary["notes"] if words in n]
    assert len(found) == 1, res.summary["notes"]
    return found[0]


def test_a_file_reached_by_a_hard_link_and_symlinks_is_read_once(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    (d / "sub").mkdir(parents=True)
    _log(d / "a.jsonl")
    os.link(d / "a.jsonl", d / "sub" / "hard.jsonl")
    os.symlink("../a.jsonl", d / "sub" / "soft.jsonl")
    os.symlink(d / "sub", d / "loop")  # a symlinked directory (and a cycle back into the tree)
    os.symlink(d, d / "sub" / "up")
    res = _analyze(d)
    assert res.summary["requests"] == {"read": 6, "accepted": 6, "rejected": 0, "rejects_by_reason": {}}
    note = _note(res, "reach a file already read")
    assert "hard.jsonl" in note and "soft.jsonl" in note and f"(= {d / 'a.jsonl'})" in note
    # also when the same file is named twice on the command line, by two names
    assert [s.path for s in expand([str(d / "a.jsonl"), str(d / "sub" / "hard.jsonl")])] == [str(d / "a.jsonl")]


def test_a_dangling_symlink_and_a_fifo_in_a_directory_are_noted(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    d.mkdir()
    _log(d / "a.jsonl")
    os.symlink("gone.jsonl", d / "dangling.jsonl")
    os.mkfifo(d / "pipe.jsonl")
    res = _analyze(d)
    assert res.summary["requests"]["accepted"] == 6
    assert "dangling.jsonl" in _note(res, "symlinks to nothing")
    assert "pipe.jsonl" in _note(res, "not regular files")


def test_an_unreadable_subdirectory_is_noted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "logs"
    (d / "locked").mkdir(parents=True)
    _log(d / "a.jsonl")
    _log(d / "locked" / "b.jsonl", first=100)
    real = os.scandir

    def scandir(path: str):  # chmod 000 does not stop root, so the refusal is simulated
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    w = walk([str(d)])
    assert w.files == [str(d / "a.jsonl")] and w.unreadable == [str(d / "locked")]
    assert any("could not be listed or read" in n and "locked" in n for n in w.notes())


def test_a_name_with_glob_characters_is_the_file_it_names(tmp_path: Path) -> None:
    weird = _log(tmp_path / "run[1] (copy).jsonl")
    _log(tmp_path / "run1 (copy).jsonl", n=4, first=50)  # what `[1]` would match as a glob
    r = runner.invoke(app, ["analyze", str(weird), "--json", "-q", "--no-findings"])
    assert r.exit_code == 0, r.output
    assert '"read": 6' in r.stdout
    assert [s.path for s in expand([str(tmp_path / "run[1]*.jsonl")])] == [str(tmp_path / "run1 (copy).jsonl")]


def test_a_fifo_on_the_command_line_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.jsonl")
    r = runner.invoke(app, ["analyze", str(tmp_path / "pipe.jsonl"), "-q"])
    assert r.exit_code == 3 and "is not a regular file (a FIFO" in r.stderr and "does not exist" not in r.stderr
    os.symlink("nowhere.jsonl", tmp_path / "link.jsonl")
    with pytest.raises(InputError, match="is a symlink to 'nowhere.jsonl', which does not exist"):
        expand([str(tmp_path / "link.jsonl")])


def test_a_glob_matching_a_dangling_symlink_notes_it(tmp_path: Path) -> None:
    _log(tmp_path / "a.jsonl")
    os.symlink("gone.jsonl", tmp_path / "b.jsonl")
    w = walk([str(tmp_path / "*.jsonl")])
    assert w.files == [str(tmp_path / "a.jsonl")] and w.dangling == [str(tmp_path / "b.jsonl")]
