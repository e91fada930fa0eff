"""The pipeline package's shape: every prefixscan module imports, the stages' import graph has no cycle,
and every stage handles an empty input."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import prefixscan
from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.run import run_analysis

PIPELINE = Path(prefixscan.__file__).parent / "pipeline"


def test_every_module_imports() -> None:
    names = [m.name for m in pkgutil.walk_packages(prefixscan.__path__, "prefixscan.")]
    assert "prefixscan.pipeline.run" in names
    for name in names:
        importlib.import_module(name)
    for gone in ("analysis", "stream", "ingest", "requests_frame", "tracecols", "io", "distributed"):
        assert f"prefixscan.{gone}" not in names  # replaced by prefixscan.pipeline


def _graph() -> dict[str, set[str]]:
    """Module -> the pipeline modules it imports (at any depth of the file, lazy imports included)."""
    mods = {p.stem for p in PIPELINE.glob("*.py")} - {"__init__"}
    graph: dict[str, set[str]] = {}
    for m in mods:
        deps = set()
        for node in ast.walk(ast.parse((PIPELINE / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("prefixscan.pipeline."):
                    deps.add(node.module.rsplit(".", 1)[1])
                elif node.module == "prefixscan.pipeline":
                    deps.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.Import):
                deps.update(a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith("prefixscan.pipeline."))
        graph[m] = deps & mods - {m}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_pipeline_import_graph_has_no_cycle() -> None:
    graph = _graph()
    assert {"read", "encode", "reuse", "aggregate", "detect", "write", "run"} <= set(graph)
    assert _cycle(graph) is None, _cycle(graph)
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # the check can fail


def test_modules_and_functions_are_short() -> None:
    for p in PIPELINE.glob("*.py"):
        src = p.read_text()
        assert src.count("\n") < 400, p.name
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno - node.lineno < 70, f"{p.name}:{node.name}"


def test_stages_on_empty_input(tmp_path: Path) -> None:
    from prefixscan.pipeline.encode import EncodeStage
    from prefixscan.pipeline.read import Reader

    log = tmp_path / "empty.jsonl"
    log.write_text("")
    cfg = AnalyzeConfig(inputs=(str(log),))
    from prefixscan.read.sources import expand

    sources = expand([str(log)])
    reader = Reader(cfg, sources, 8)
    assert list(reader.events()) == [] and reader.read == 0
    stage = EncodeStage(cfg, sources)
    assert list(stage.batches(Reader(cfg, sources, 8))) == []
    assert stage.result(reader).rejects == []
    for out in (None, str(tmp_path / "run")):
        res = run_analysis(AnalyzeConfig(inputs=(str(log),), output=out, quiet=True))
        assert res.summary["requests"]["accepted"] == 0
        assert res.tables["requests"].num_rows == 0 and res.summary["tokens"]["prompt"] == 0
