"""Start-up: what `--help` and `analyze` import, the one-command application, and that hiding pandas from
pyarrow's probes changes no byte of a run (prefixscan/startup.py, prefixscan/cli/app.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import COMMANDS, build_app, command_named
from tests.conftest import ROOT

HEAVY = ("pandas", "polars", "numba", "pyarrow", "duckdb", "transformers", "tiktoken", "matplotlib", "jinja2")
HAVE_PANDAS = importlib.util.find_spec("pandas") is not None


def _cli_in_subprocess(args: list[str], after: str) -> subprocess.CompletedProcess:
    """Run the console entry point in a fresh interpreter, then `after` (which sees sys.modules)."""
    code = ("import sys\nfrom prefixscan.cli.app import main\n"
            f"sys.argv = ['prefixscan', *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n" + after)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("args", [["--help"], ["analyze", "--help"], ["simulate", "--help"], ["--version"]])
def test_help_imports_no_heavy_library(args) -> None:
    r = _cli_in_subprocess(args, f"bad = [m for m in {HEAVY!r} if m in sys.modules]\nprint(bad)\nassert not bad")
    assert r.returncode == 0, r.stderr + r.stdout


def test_one_command_line_imports_one_command_module() -> None:
    """`prefixscan analyze --help` builds only the analyze command (its module, its option groups and the
    shared helpers): the other command modules stay unloaded."""
    after = ("others = sorted(m for m in sys.modules if m.startswith('prefixscan.cli.') and m not in "
             "('prefixscan.cli.app', 'prefixscan.cli.analyze', "
             "'prefixscan.cli.common', 'prefixscan.cli.choices', 'prefixscan.cli.groups', 'prefixscan.cli.usage'))\n"
             "print(others)\nassert not others\n"
             "assert 'prefixscan.cost' not in sys.modules and 'prefixscan.pipeline' not in sys.modules")
    r = _cli_in_subprocess(["analyze", "--help"], after)
    assert r.returncode == 0, r.stderr + r.stdout


def test_an_encode_worker_imports_neither_polars_nor_numba() -> None:
    """An encode worker imports its loop, the tokenizer and the detector's per-content memo
    (`encode_workers.Prework`); the detect package's init must not pull in the findings finalisation
    (polars, the counterfactual's numba kernels), which every worker would pay for at start-up."""
    code = ("import sys\nimport prefixscan.pipeline.encode_workers, prefixscan.encode.tokenize.tiktoken_backend\n"
            "import prefixscan.detect.content, prefixscan.detect.detector\n"
            "bad = [m for m in ('polars', 'numba', 'duckdb', 'prefixscan.detect.run') if m in sys.modules]\n"
            "print(bad)\nassert not bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr + r.stdout


def test_command_named_skips_root_options() -> None:
    assert command_named(["analyze", "x.jsonl"]) == "analyze"
    assert command_named(["--config", "analyze", "simulate", "run"]) == "simulate"  # --config takes a value
    assert command_named(["--config=p.toml", "record-events", "--help"]) == "record-events"
    assert command_named(["--help", "analyze"]) is None
    assert command_named(["--version"]) == "" and command_named([]) is None  # "": the root options only
    assert command_named(["analyse"]) is None  # unknown: the full application says so


@pytest.mark.parametrize("name", list(COMMANDS))
def test_one_command_application_prints_the_same_help(name) -> None:
    runner = CliRunner()
    full = runner.invoke(build_app(), [name, "--help"], env={"COLUMNS": "100"})
    alone = runner.invoke(build_app(name), [name, "--help"], env={"COLUMNS": "100"})
    assert full.exit_code == alone.exit_code == 0
    assert alone.stdout == full.stdout


@pytest.mark.skipif(not HAVE_PANDAS, reason="pandas is not installed: pyarrow cannot import it anyway")
def test_analyze_does_not_import_pandas_and_writes_the_same_bytes(tmp_path: Path) -> None:
    """The CLI hides pandas from pyarrow's probes; the library API with pandas already imported does not.
    Both runs must write identical tables (the probes only decide whether pyarrow looks for pandas objects)."""
    log = str(ROOT / "sample_logs" / "chat.jsonl")
    unused = ("pandas", "duckdb", "transformers", "matplotlib", "jinja2", "ray", "rich")  # by analyze -q of chat
    r = _cli_in_subprocess(["analyze", log, "-o", str(tmp_path / "cli"), "-q", "--workers", "0"],
                           f"bad = [m for m in {unused!r} if m in sys.modules]\nassert not bad, bad")
    assert r.returncode == 0, r.stderr + r.stdout
    code = ("import pandas, prefixscan\n"
            f"prefixscan.analyze({log!r}, output={str(tmp_path / 'api')!r}, quiet=True, workers=0)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    tables = sorted(p.name for p in (tmp_path / "cli").glob("*.parquet"))
    assert "requests.parquet" in tables and tables == sorted(p.name for p in (tmp_path / "api").glob("*.parquet"))
    for name in tables:
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "api" / name).read_bytes(), name
    a, b = (json.loads((tmp_path / d / "manifest.json").read_text())["tables"] for d in ("cli", "api"))
    assert a == b


@pytest.mark.skipif(not HAVE_PANDAS, reason="pandas is not installed")
def test_pandas_stays_usable_after_the_probe() -> None:
    code = ("import sys\nfrom prefixscan.startup import skip_pandas_probe\nskip_pandas_probe()\n"
            "assert 'pandas' not in sys.modules\n"
            "import pandas as pd, pyarrow as pa\n"
            "t = pa.Table.from_pandas(pd.DataFrame({'a': [1, None]}))\n"
            "assert t.column('a').null_count == 1 and t.to_pandas()['a'].isna().sum() == 1\n"
            "assert sys.meta_path[0].__class__.__name__ != '_Hidden'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
