"""`prefixscan report`: a sample run (analyze + simulate + findings), an almost empty run, determinism,
self-containment, privacy and the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
import typer
from typer.testing import CliRunner

from prefixscan.cli import report as report_cli
from prefixscan.report import html as html_report
from prefixscan.report.assemble import build
from prefixscan.report.write import write_report
from prefixscan.run.load import load_run
from prefixscan.run.rundir import add_tables
from tests.conftest import chat, write_jsonl

SECTIONS = (
    "Executive summary",
    "Traffic profile",
    "Reuse by tenant, prefix class and turn",
    "Capacity curve: LRU vs optimal vs ideal",
    "Top shared prefixes (redacted)",
    "Cache breakers",
    "Routing policy comparison",
    "GPUs and dollars",
    "Measurement plan for the rollout",
    "Rollout order",
    "Appendix",
)
FIGURES = ("reuse_tenant", "reuse_prefix_class", "reuse_turn", "capacity", "policies", "gpus")


def _analyze(log: Path, out: Path) -> Path:
    from prefixscan.pipeline.run import analyze

    analyze(str(log), output=str(out), quiet=True, command_line=f"prefixscan analyze {log} -o {out}")
    return out


def _app() -> typer.Typer:
    a = typer.Typer(pretty_exceptions_enable=False)

    @a.callback()
    def _root() -> None:
        """prefixscan"""

    report_cli.register(a)
    return a


def chat_run(d: Path) -> Path:
    """Analyze a multi-tenant multi-turn chat log (8 conversations x 4 turns) into `d/run`."""
    recs, i = [], 0
    for turn in range(1, 5):
        for c in range(8):
            recs.append(chat(i, f"c{c}", turn, tenant=("acme", "globex", "initech")[c % 3], ts=i * 0.5))
            i += 1
    return _analyze(write_jsonl(d / "chat.jsonl", recs), d / "run")


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A multi-tenant multi-turn chat run with a 2-replica simulation and a findings table."""
    from prefixscan.sim import SimConfig, simulate

    d = tmp_path_factory.mktemp("sample")
    run = chat_run(d)
    simulate(run, SimConfig(replicas=2, policies=("round_robin", "sglang_cache_aware", "prefix_hash"))).save(
        run
    )
    findings = pa.table(
        {
            "kind": ["timestamp"],
            "tenant": ["acme"],
            "message_index": [0],
            "role": ["system"],
            "char_offset": [12],
            "token_offset": [3],
            "requests_affected": [11],
            "tokens_lost": [4321],
            "example": ["Request time: 2026-07-23T10:15:00Z user 84721"],
            "fix": ["move the timestamp after the cacheable block"],
        }
    )
    add_tables(
        run, {"findings": findings}, section="findings", info={"command_line": f"prefixscan findings {run}"}
    )
    return run


@pytest.fixture(scope="module")
def sample_report(sample_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_report(sample_run, tmp_path_factory.mktemp("out"))


@pytest.fixture(scope="module")
def empty_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One good record and one malformed line: no reuse, one reject, no simulation or findings."""
    d = tmp_path_factory.mktemp("empty")
    log = write_jsonl(d / "one.jsonl", [chat(0, "c0", 1), "{not json"])
    return _analyze(log, d / "run")


def test_sample_report_has_every_section_and_figure(sample_report: dict[str, Path]) -> None:
    md = sample_report["md"].read_text()
    html = sample_report["html"].read_text()
    for s in SECTIONS:
        assert f"## {s}" in md, s
        assert s in html, s
    for f in FIGURES:
        assert f"](report_figures/{f}.svg)" in md, f
        assert (sample_report["figures"] / f"{f}.svg").read_text().startswith("<?xml"), f
        assert f'<figure id="fig-{f}"' in html, f
    assert html.count("<svg") == len(FIGURES)
    assert "No simulation" not in md and "No cache-breaker" not in md


def test_numbers_come_from_the_tables(sample_run: Path, sample_report: dict[str, Path]) -> None:
    run = load_run(sample_run)
    md = sample_report["md"].read_text()
    whole = next(r for r in run.table("summaries").to_pylist() if r["dimension"] == "all")
    assert f"| token-weighted (cached / prompt tokens) | {whole['token_weighted']:.1%} |" in md
    for p in run.table("sim_policies").to_pylist():
        assert f"| {p['policy']} | {p['hit_rate_token_weighted']:.1%} |" in md
    assert "4,321" in md and "move the timestamp after the cacheable block" in md  # finding, fix and gain
    assert "prefixscan findings" in md and "prefixscan analyze" in md  # command lines in the appendix
    for step in (
        "Fix the template and move changing fields after the cacheable block.",
        "Add warm preference with a strict wait limit and a cold fallback route.",
    ):
        assert step in md
    for metric in (
        "cached-token rate",
        "warm, partial and cold",
        "queue wait by routing decision",
        "evictions",
        "spill rate",
        "predicted vs actual cached tokens",
    ):
        assert metric in md, metric
    assert "GiB" in md and "token-weighted" in md


def test_report_is_private(sample_report: dict[str, Path]) -> None:
    for kind in ("md", "html"):
        text = sample_report[kind].read_text()
        assert "reset my password" not in text  # user message text never appears
        assert "84721" not in text and "2026-07-23" not in text  # finding example is redacted


def test_html_is_self_contained(sample_report: dict[str, Path]) -> None:
    html = sample_report["html"].read_text()
    assert "<script" not in html
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", html)
    assert "@import" not in html and "url(http" not in html
    assert "Content-Security-Policy" in html
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "figure ids must not collide once inlined"


def test_report_is_deterministic(sample_run: Path, tmp_path: Path) -> None:
    a = write_report(sample_run, tmp_path / "a")
    b = write_report(sample_run, tmp_path / "b")
    assert a["md"].read_bytes() == b["md"].read_bytes()
    assert a["html"].read_bytes() == b["html"].read_bytes()
    for f in sorted(a["figures"].glob("*.svg")):
        assert f.read_bytes() == (b["figures"] / f.name).read_bytes(), f.name


def test_almost_empty_run_names_the_missing_commands(empty_run: Path, tmp_path: Path) -> None:
    out = write_report(empty_run, tmp_path)
    md = out["md"].read_text()
    for s in SECTIONS:
        assert f"## {s}" in md, s
    assert f"run `prefixscan simulate {empty_run}` to fill this section" in md
    assert "No cache breakers were found." in md  # analyze writes the (empty) findings table
    assert "Verdict: not available" in md and "No prefix was shared by two requests." in md
    assert "| rejected | 1 |" in md
    html = out["html"].read_text()
    assert "simulate" in html and html.count("<svg") == len(list(out["figures"].glob("*.svg")))


def test_options_reach_the_cost_section(sample_run: Path, empty_run: Path) -> None:
    from prefixscan.cost.estimator import EstimateOptions

    data = build(sample_run, EstimateOptions(replicas=16, model="llama-3.1-8b"))
    assert data.estimate is not None and data.estimate["assumptions"]["replicas"] == 16
    assert data.kv.model == "llama-3.1-8b" and data.kv.source == "the report's scenario"
    assert data.scenario is not None and data.scenario.startswith("16 replicas of llama-3.1-8b")
    assert data.estimate["baselines"]["basis"] == "replay"  # the saved simulation ran 2 replicas
    assert [p["policy"] for p in data.policies] == ["round_robin", "sglang_cache_aware"]
    empty = build(empty_run, EstimateOptions(replicas=16))
    assert empty.estimate is None and empty.estimate_error  # one request: no rate to cost


def test_embed_svg_prefixes_ids() -> None:
    from prefixscan.report.figures import Figure

    svg = (
        '<?xml version="1.0"?>\n<!DOCTYPE svg>\n<svg xmlns="x"><defs><clipPath id="p1"/></defs>'
        '<g clip-path="url(#p1)"><use xlink:href="#m1"/></g></svg>'
    )
    out = html_report.embed_svg(Figure("cap", "a <b>", svg))
    assert out.startswith('<svg role="img" aria-label="a &lt;b&gt;"')
    assert 'id="cap-p1"' in out and "url(#cap-p1)" in out and 'href="#cap-m1"' in out


def test_cli_formats_and_errors(sample_run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(_app(), ["report", str(sample_run), "-o", str(tmp_path / "md"), "--format", "md"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == str(tmp_path / "md" / "report.md")
    assert not (tmp_path / "md" / "report.html").exists()
    res = runner.invoke(_app(), ["report", str(sample_run), "-o", str(tmp_path / "h"), "--format", "html"])
    assert res.exit_code == 0 and res.stdout.strip() == str(tmp_path / "h" / "report.html")
    assert not (tmp_path / "h" / "report_figures").exists()
    res = runner.invoke(_app(), ["report", str(sample_run), "--format", "pdf"])
    assert res.exit_code != 0 and "--format must be md, html or both" in res.output
    res = runner.invoke(_app(), ["report", str(tmp_path / "nope")])
    assert res.exit_code != 0 and "not a prefixscan run directory" in res.output


def test_report_defaults_to_the_run_dir(empty_run: Path) -> None:
    res = CliRunner().invoke(_app(), ["report", str(empty_run)])
    assert res.exit_code == 0, res.output
    assert (empty_run / "report.md").exists() and (empty_run / "report.html").exists()


def test_markdown_cells_keep_redaction_markers_visible() -> None:
    from prefixscan.report.markdown import _cell

    assert _cell("mail <email> | id\n<id>") == "mail &lt;email&gt; \\| id &lt;id&gt;"


def test_results_model_never_imports_its_renderers() -> None:
    """model.py holds the data and assemble.py fills it in; markdown/html/figures render it; only write.py
    knows both."""
    import ast

    import prefixscan.report.assemble as assemble
    import prefixscan.report.model as model

    for module in (model, assemble):
        tree = ast.parse(Path(module.__file__).read_text())
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        for renderer in ("markdown", "html", "figures", "write"):
            assert f"prefixscan.report.{renderer}" not in names, module.__name__
        assert not any(n == "prefixscan.report" for n in names)


def test_a_new_section_is_one_function(sample_run: Path) -> None:
    from prefixscan.report import markdown

    data = build(sample_run)

    def extra(d):
        return [("h", 2, "Extra section"), ("p", f"{len(d.policies or [])} policies")]

    blocks = markdown.document(data, {}, (*markdown.SECTIONS, extra))
    assert blocks[-2:] == [("h", 2, "Extra section"), ("p", f"{len(data.policies)} policies")]


def test_report_names_one_scenario_and_the_columns_say_what_they_hold(sample_report: dict[str, Path]) -> None:
    md = sample_report["md"].read_text()
    first = md.splitlines()[2]
    assert first.startswith("**Scenario:** 2 replicas of llama-3.1-8b (bf16, TP1) on h100-sxm")
    assert "(the saved simulation's" not in first or "req/s" in first
    assert "| scenario | requests with a hit | prompt tokens cached | of ideal | prefill tok/s |" in md
    assert "hit (requests)" not in md and "| policy | prompt tokens cached | of ideal |" in md
