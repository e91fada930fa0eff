"""Start-up and exit: what `--help` and `analyze` import (and when), the one-command application, that
hiding pandas from pyarrow's probes changes no byte of a run, and that the console command ends with its
outputs complete and nothing left behind (prefixscan/startup.py, prefixscan/cli/app.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import COMMANDS, build_app, command_named
from tests.conftest import ROOT, write_jsonl

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


FIRST_SUBMIT = """
from prefixscan.pipeline import encode_pool
first = []
submit = encode_pool.EncodePool.submit
def recorded(self, kind, items):
    if not first:
        first.append(sorted(m for m in ('polars', 'numba', 'prefixscan.pipeline.reuse', 'prefixscan.pipeline.aggregate',
                                        'prefixscan.detect.run') if m in sys.modules))
    return submit(self, kind, items)
encode_pool.EncodePool.submit = recorded
"""


def test_analyze_hands_out_its_first_records_before_importing_the_later_stages(tmp_path: Path) -> None:
    """With encode workers, analyze reads its first records and sends them to the workers before it imports
    polars, numba or the reuse, aggregate and findings stages (run._reuse builds the reuse stage at the first
    Batch): the workers, which start at once, need not wait for those imports. The tables are those of a run
    encoded in this process alone (`--workers 0`)."""
    log = str(ROOT / "sample_logs" / "chat.jsonl")
    code = ("import sys\n" + FIRST_SUBMIT + "from prefixscan.cli.app import main\n"
            f"sys.argv = ['prefixscan', 'analyze', {log!r}, '-o', {str(tmp_path / 'run')!r}, '-q', '--workers', '1']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(first)\nassert first == [[]], first\nassert 'numba' in sys.modules  # imported later, when needed")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr + r.stdout
    r = _cli_in_subprocess(["analyze", log, "-o", str(tmp_path / "alone"), "-q", "--workers", "0"], "")
    assert r.returncode == 0, r.stderr + r.stdout
    tables = sorted(p.name for p in (tmp_path / "run").glob("*.parquet"))
    assert "requests.parquet" in tables and tables == sorted(p.name for p in (tmp_path / "alone").glob("*.parquet"))
    for name in tables:
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes(), name


def test_hold_keeps_objects_only_for_the_console_command() -> None:
    """`startup.hold` is a no-op for library callers (their objects are freed as usual); after
    `keep_until_exit` (the console command only) what it is given stays referenced until `let_go` (the next run)."""
    code = ("import gc, weakref\nfrom prefixscan import startup\n"
            "class Big:\n    pass\n"
            "a = Big(); ra = weakref.ref(a); assert startup.hold(a) is a; del a; gc.collect()\n"
            "assert ra() is None, 'a library caller keeps nothing'\n"
            "startup.keep_until_exit()\n"
            "b = Big(); rb = weakref.ref(b); startup.hold(b); del b; gc.collect()\n"
            "assert rb() is not None\n"
            "startup.let_go(); gc.collect()\n"
            "assert rb() is None, 'a second run lets the first one go'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr + r.stdout


@pytest.mark.parametrize("workers", ["0", "1"])
def test_console_command_skips_the_teardown_beside_the_tokenizers_threads(tmp_path: Path, workers: str) -> None:
    """The tokenizer's idle thread pool (encoding in this process) is joined as the interpreter's exit would,
    so the console command still ends with os._exit, not with the teardown: an atexit hook never runs."""
    code = ("import atexit, sys\natexit.register(lambda: print('TEARDOWN'))\nfrom prefixscan.cli.app import console\n"
            f"sys.argv = ['prefixscan', 'analyze', {str(ROOT / 'sample_logs' / 'chat.jsonl')!r}, '-o', "
            f"{str(tmp_path / 'run')!r}, '--json', '-q', '--workers', {workers!r}]\nconsole()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "TEARDOWN" not in r.stdout and json.loads(r.stdout)["requests"]["accepted"] > 0
    assert (tmp_path / "run" / "manifest.json").exists()


def test_console_command_exits_with_its_code_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """The `prefixscan` command ends with os._exit and keeps the run's objects (cli/app.py `console`): every
    exit code as documented, stdout complete (the --json summary parses), the run directory whole, and no
    temporary file or directory left (the scratch directory of a run without -o, the hidden run being built)."""
    script = Path(sys.executable).with_name("prefixscan")
    if not script.exists():
        pytest.skip("the console script is not installed beside this interpreter")
    log = str(ROOT / "sample_logs" / "chat.jsonl")
    bad = str(write_jsonl(tmp_path / "bad.jsonl", ["{bad"]))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    cases = [(["analyze", log, "--json", "-q", "--workers", "1"], 0),  # no -o: a scratch directory in TMPDIR
             (["analyze", str(tmp_path / "missing.jsonl")], 3), (["analyze", bad, "--strict"], 4),
             (["analyze", log, "--field", "nonsense"], 2), (["analyze", log, "--metrics", "m.prom"], 2),
             (["analyze", log, "-o", "run", "--json", "-q", "--workers", "1"], 0),
             (["analyze", log, "-o", "run"], 5)]  # exists, no --force
    for args, code in cases:
        r = subprocess.run([str(script), *args], capture_output=True, text=True, cwd=out, env=env)
        assert r.returncode == code, (args, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
        if code == 0:
            summary = json.loads(r.stdout)
            assert summary["requests"]["accepted"] > 0
        else:
            assert r.stderr.startswith("prefixscan: error"), r.stderr
        left = [p.name for p in tmp.iterdir() if p.name != "data-gym-cache"]  # tiktoken's own cache
        assert not left, (args, left)
        assert [p.name for p in out.iterdir()] == (["run"] if "-o" in args else []), args  # no hidden sibling
    assert {"manifest.json", "requests.parquet"} <= {p.name for p in (out / "run").iterdir()}
