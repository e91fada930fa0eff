"""Hostile text in the data never acts in an output (issue 28): terminal escapes, Markdown links and remote
images, HTML, characters XML forbids. Each value is escaped for the medium it lands in (report/escape.py);
CSV and JSON to a pipe or a file stay data-exact."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.report import escape
from tests.conftest import ROOT, chat, write_jsonl

HOSTILE = [
    "osc52\x1b]52;c;cHduZWQ=\x07x",  # clipboard write
    "clr\x1b[2Jscreen",  # clear screen
    "cr\rback",  # bare CR: rewrites the line
    "![x](http://evil.example/p.png)",  # remote image
    "[click](javascript:alert(1))",  # link
    "c1\x9b31m\x85nel",  # C1 controls
    "bidi\u202eg\u2066",  # bidi override / isolate
    "<script>alert(1)</script><img src=http://evil.example/i.png>",
    "a|b`c**d$x$_e_ &amp; #h",  # table pipe, code, emphasis, mathtext, entity
    "nul\x00bell\x07",
]
RAW = ("\x1b", "\r", "\x9b", "\x85", "\u202e", "\u2066", "\x00", "\x07")


def _log(path: Path) -> Path:
    recs = []
    i = 0
    for turn in range(1, 4):
        for c, name in enumerate(HOSTILE):
            day = f"Today is 2026-07-{10 + i % 17:02d}. "  # a cache breaker, so findings name the tenants
            r = chat(i, f"conv{c}{name}", turn, tenant=name, model=HOSTILE[(c + 1) % len(HOSTILE)],
                     request_id=f"req{i}{name}")
            r["messages"][0]["content"] = day + r["messages"][0]["content"]
            recs.append(r)
            i += 1
    return write_jsonl(path, recs)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("hostile")
    log = _log(d / "log\x1b[2J.jsonl")  # the file name too
    runner = CliRunner()
    out = {"dir": d, "run": d / "run"}
    out["analyze"] = runner.invoke(app, ["analyze", str(log), "-o", str(d / "run")])
    out["simulate"] = runner.invoke(app, ["simulate", str(d / "run"), "-q"])
    out["findings"] = runner.invoke(app, ["findings", str(d / "run")])
    out["report"] = runner.invoke(app, ["report", str(d / "run")])
    out["report_o"] = runner.invoke(app, ["report", str(d / "run"), "-o", str(d / "rep\x1b]52;c;eA==\x07")])
    return out


def test_every_command_ran(hostile) -> None:
    for k in ("analyze", "simulate", "findings", "report", "report_o"):
        assert hostile[k].exit_code == 0, (k, hostile[k].output)


def _raw_controls(text: str) -> list[str]:
    return sorted({c for c in text if c in RAW or (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0})


def test_terminal_outputs_show_no_raw_control(hostile) -> None:
    """Captured without a terminal Rich adds no styling, so any control character would be the data's."""
    for k in ("analyze", "simulate", "findings", "report", "report_o"):
        assert _raw_controls(hostile[k].output) == [], k
    assert "\\x1b]52" in hostile["report_o"].stdout  # the -o NAME echoed, visibly
    r = CliRunner().invoke(app, ["query", str(hostile["run"]), "select tenant, model, conversation_id, request_id "
                                                                "from requests"])
    assert r.exit_code == 0 and _raw_controls(r.output) == [] and "\\x1b[2J" in r.stdout


def test_report_md_has_no_control_and_no_live_markup(hostile) -> None:
    from markdown_it import MarkdownIt

    md = (hostile["run"] / "report.md").read_text()
    assert _raw_controls(md) == []
    assert "evil.example" in md and "javascript" in md  # the data is shown...
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    seen = []

    def walk(ts: list) -> None:
        for t in ts:
            seen.append(t)
            walk(t.children or [])

    walk(tokens)
    links = [t.attrGet("href") for t in seen if t.type == "link_open"]
    images = [t.attrGet("src") for t in seen if t.type == "image"]
    assert links == []  # ...never as a link or an image
    assert images and all(src.startswith("report_figures/") for src in images)
    assert not [t for t in seen if t.type in ("html_inline", "html_block")]
    rows = [t for t in seen if t.type == "inline" and "clr" in t.content]
    assert rows  # tenant rows are still table cells (the pipe in a name did not split a row)
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert "a|b`c**d$x$_e_ &amp;amp; #h" in html  # rendered exactly as the value (entity shown, not decoded)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, dict(attrs)))


def test_report_html_has_no_control_and_no_live_markup(hostile) -> None:
    html = (hostile["run"] / "report.html").read_text()
    assert _raw_controls(html) == []
    p = _Tags()
    p.feed(html)
    p.close()
    names = {t for t, _ in p.tags}
    assert not names & {"script", "img", "a", "iframe", "object"} - {"a"}  # no element from the data
    assert all(a.get("href", "#").startswith("#") for t, a in p.tags if t == "a")  # only the table of contents
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_every_svg_is_xml(hostile) -> None:
    figs = sorted((hostile["run"] / "report_figures").glob("*.svg"))
    assert figs
    for f in figs:
        text = f.read_text()
        ET.fromstring(text)  # raises on a character XML 1.0 forbids
        assert _raw_controls(text) == [], f.name
    tenant_fig = (hostile["run"] / "report_figures" / "reuse_tenant.svg").read_text()
    assert "clr\\x1b[2Jscreen" in tenant_fig and "$x$" in tenant_fig  # shown as text, no mathtext


def test_csv_and_json_stay_exact_to_a_pipe_and_visible_on_a_terminal(hostile) -> None:
    run = str(hostile["run"])
    sql = "select distinct tenant from requests order by 1"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    piped = subprocess.run([sys.executable, "-m", "prefixscan", "query", run, sql, "--format", "csv"],
                           capture_output=True, env=env, check=True).stdout.decode()
    assert "clr\x1b[2Jscreen" in piped and "osc52\x1b]52;c;cHduZWQ=\x07x" in piped  # machine output untouched
    js = subprocess.run([sys.executable, "-m", "prefixscan", "query", run, sql, "--format", "json"],
                        capture_output=True, env=env, check=True).stdout.decode()
    assert sorted(r["tenant"] for r in json.loads(js)) == sorted(HOSTILE) and "\x1b" not in js
    out = _on_a_terminal([sys.executable, "-m", "prefixscan", "query", run, sql, "--format", "csv"], env)
    assert "\x1b" not in out and "\x07" not in out and "cr\rback" not in out
    assert "clr\\x1b[2Jscreen" in out and "cr\\x0dback" in out


def test_commands_on_a_real_terminal_send_no_data_escape(hostile, tmp_path) -> None:
    """On a terminal Rich styles its own output (so ESC appears), but never one of the data's sequences:
    CliRunner cannot show this (click strips CSI sequences from echo when the output is no terminal)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    log = next(hostile["dir"].glob("log*.jsonl"))
    run = str(hostile["run"])
    py = [sys.executable, "-m", "prefixscan"]
    for cmd in (["analyze", str(log), "-o", str(tmp_path / "run")], ["findings", run],
                ["report", run, "-o", str(tmp_path / "rep\x1b[2J")],
                ["query", run, "select tenant, model, conversation_id, request_id from requests"]):
        out = _on_a_terminal(py + cmd, env)
        for sequence in ("\x1b[2J", "\x1b]52", "cr\rback", "\x9b", "\x85", "\u202e", "\x07"):
            assert sequence not in out, (cmd[0], sequence)
        if cmd[0] == "report":
            assert "rep\\x1b[2J" in out  # the -o name, echoed visibly


def _on_a_terminal(cmd: list[str], env: dict) -> str:
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    proc.wait()
    os.close(leader)
    assert proc.returncode == 0, out
    return out.decode().replace("\r\n", "\n")


@pytest.mark.parametrize("value", [*HOSTILE, "lone\udc80surrogate\ufffe"])
def test_each_medium_helper(value: str) -> None:
    for helper in (escape.clean, escape.markdown, escape.html_text, escape.svg_text):
        assert _raw_controls(helper(value)) == [], helper.__name__
    assert "](" not in escape.markdown(value).replace("\\](", "")
    assert "<" not in escape.html_text(value) and "<" not in escape.markdown(value)
    ET.fromstring(f"<t>{escape.xml_legal(escape.html_text(value))}</t>")
    assert escape.visible(escape.visible(value)) == escape.visible(value)


def test_a_value_cannot_close_a_code_span_or_open_markup() -> None:
    text = f"policy `{escape.data('a`b **c** [d](e)')}` and **{escape.data('x**y')}**"
    md = escape.markdown_inline(text)
    assert md == "policy ``a`b **c** [d](e)`` and **x\\*\\*y**"
    assert escape.html_inline(text) == "policy <code>a`b **c** [d](e)</code> and <strong>x**y</strong>"
    assert re.fullmatch(r"```+\n.*\n```+", escape.markdown_code_block("a\n```\nb"), re.S)
    assert escape.markdown_code_block("a\n```\nb").startswith("````\n")
