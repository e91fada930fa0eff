"""The k-sharers rule on findings, keyed tenant hashes, redaction markers and terminal-safe printing."""

from __future__ import annotations

import hashlib
import hmac

import polars as pl
import pytest
from rich.console import Console

from prefixscan.detect.findings import Finding, fix_sentence
from prefixscan.detect.run import guard_findings
from prefixscan.privacy import scrub_argv, scrub_command_line, tenant_hasher
from prefixscan.redact import hidden, redact, redact_snippet
from prefixscan.report.escape import clean, safe


def _finding(kind: str, label: str | None, example: str, rids: list[str], mi: int = 0) -> Finding:
    return Finding(kind=kind, tenant="acme", family=None, label=label, message_index=mi, role="system",
                   char_offset=3, token_offset=None, block_index=None, requests_affected=len(rids),
                   distinct_values=2, tokens_lost=100, example=example, example_request_id=rids[0], detail=None,
                   fix=fix_sentence(kind, label, "system"), request_ids=rids)


def _req(convs: list[str | None], lengths: list[int] | None = None,
         users: list[str | None] | None = None) -> pl.DataFrame:
    """Requests r0.. of tenant acme; prompts of different lengths unless `lengths` says otherwise."""
    n = len(convs)
    return pl.DataFrame({"request_id": [f"r{i}" for i in range(n)],
                         "conversation_id": pl.Series(convs, dtype=pl.String),
                         "tenant": ["acme"] * n, "user": pl.Series(users or [None] * n, dtype=pl.String),
                         "prompt_tokens": lengths or [100 + 7 * i for i in range(n)]})


def test_label_shared_by_k_conversations_stays_one_customers_label_is_hidden() -> None:
    shared = _finding("timestamp", "Request time", "Request time: ##:##", [f"r{i}" for i in range(5)])
    alone = _finding("timestamp", "Dear Zorblax", "Dear Zorblax: ##:##", [f"r{i}" for i in range(5, 12)])
    req = _req([f"c{i}" for i in range(5)] + ["cz"] * 7)
    guard_findings([shared, alone], req, k=5, include_text=False)
    assert (shared.label, shared.example) == ("Request time", "Request time: ##:##")
    assert alone.label == "<text 12 chars>" and alone.example == "<text 12 chars>: ##:##"
    assert "Zorblax" not in alone.fix  # the hidden label is named by its kind, length and place (issue 27)
    assert alone.fix.startswith("Move the timestamp field at message 0 (system), char 3 (its label, 12 characters")
    kept = _finding("timestamp", "Dear Zorblax", "Dear Zorblax: ##:##", [f"r{i}" for i in range(5, 12)])
    guard_findings([kept], req, k=5, include_text=True)
    assert kept.label == "Dear Zorblax"


def test_one_customers_label_in_many_conversations_is_one_source() -> None:
    """Six requests of one customer, each its own (inferred or real) conversation, same prompt length:
    one source. Six users, or six prompts with different surroundings, are six."""
    rids = [f"r{i}" for i in range(6)]

    def guarded(req: pl.DataFrame) -> str | None:
        f = _finding("timestamp", "Dear Zorblax", "Dear Zorblax: ##:##", rids)
        guard_findings([f], req, k=5, include_text=False)
        return f.label

    assert guarded(_req([f"inferred:{i}" for i in range(6)], lengths=[250] * 6)) == "<text 12 chars>"
    assert guarded(_req([None] * 6, lengths=[250] * 6)) == "<text 12 chars>"
    assert guarded(_req([f"c{i}" for i in range(6)], lengths=[250] * 6, users=["zorblax"] * 6)) == "<text 12 chars>"
    assert guarded(_req([f"c{i}" for i in range(6)], lengths=[250] * 6, users=[f"u{i}" for i in range(6)])) == (
        "Dear Zorblax")
    assert guarded(_req([f"c{i}" for i in range(6)])) == "Dear Zorblax"  # different surroundings
    assert guarded(_req(["c0"] * 6)) == "<text 12 chars>"  # one conversation is one source


def test_id_values_show_only_their_kind_and_drift_lines_are_always_hidden() -> None:
    acct = _finding("request_id", "Account", "Account: ACCT-QZX#Q#W", [f"r{i}" for i in range(6)])
    drift = _finding("whitespace", None, "whitespace: Hello  Zorblax, welcome", ["r0", "r1"])
    guard_findings([acct, drift], _req([f"c{i}" for i in range(6)]), k=5, include_text=False)
    assert acct.example == "Account: <request_id>"
    assert drift.example == "whitespace: " + hidden(len("Hello  Zorblax, welcome"))


def test_tenant_hash_is_keyed_hmac_and_the_key_is_scrubbed() -> None:
    h = tenant_hasher("k1")
    want = "t-" + hmac.new(b"k1", b"acme", hashlib.sha256).hexdigest()[:16]
    assert h("acme") == want and h(None) is None
    assert tenant_hasher("k2")("acme") != want  # a guessed name cannot be checked without the key
    assert want != "t-" + hashlib.sha256(b"acme").hexdigest()[:16]
    assert scrub_argv(["analyze", "--tenant-key", "s3", "x", "--tenant-key=s4"]) == [
        "analyze", "--tenant-key", "***", "x", "--tenant-key=***"]
    assert scrub_command_line("prefixscan analyze --tenant-key 's 3' log") == "prefixscan analyze --tenant-key *** log"


def test_redaction_masks_cut_emails_and_leaves_markers_alone() -> None:
    assert redact("write to bob.smith@exa") == "write to <email>"
    m = hidden(412, "tokens", "2f9a1c0011223344")
    assert m == "<text 2f9a1c… 412 tokens>"
    assert redact(f"{m} and 42") == f"{m} and ##" and redact_snippet(redact_snippet(m)) == m


@pytest.mark.parametrize("raw,want", [
    ("a\x1b[2Jb", "a\\x1b[2Jb"),  # clear screen: shown, not acted on
    ("x\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\y",
     "x\\x1b]8;;http://evil.example\\x1b\\click\\x1b]8;;\\x1b\\y"),  # OSC 8 hyperlink
    ("c\x1b]52;c;cHduZWQ=\x07d", "c\\x1b]52;c;cHduZWQ=\\x07d"),  # OSC 52 clipboard write
    ("t\x1b]0;title\x07u", "t\\x1b]0;title\\x07u"),  # window title
    ("a\rb\bc", "a\\x0db\\x08c"),
    ("abc\u202edef\u2066", "abc\\u202edef\\u2066"),  # bidi override / isolate
    ("tab\there\nnext", "tab here next"),
    ("\x9b2Jz", "\\x9b2Jz"),  # 8-bit CSI
    ("lone \udc80", "lone \\udc80"),  # a lone surrogate would make printing fail
])
def test_clean_shows_escapes_and_controls(raw: str, want: str) -> None:
    """issue 28: a control character from the data is made visible (two tenants stay two), never acted on."""
    assert clean(raw) == want


def test_safe_values_print_literally_through_rich() -> None:
    console = Console(record=True, width=200, emoji=False, color_system="truecolor", force_terminal=True)
    console.print(f"tenant {safe('[bold red]evil[/] [link=http://x]y[/link] :smile:')} \x1b[0m")
    out = console.export_text()
    assert "[bold red]evil[/] [link=http://x]y[/link] :smile:" in out
    raw = Console(file=None, width=200, emoji=False, force_terminal=True)
    with raw.capture() as cap:
        raw.print(safe("\x1b]8;;http://evil\x1b\\x\x1b]8;;\x1b\\"))
    assert "\x1b]" not in cap.get() and "\\x1b" in cap.get()  # no OSC of any kind: shown as text


def test_tenant_key_from_a_project_file_is_used_but_never_recorded(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from prefixscan.cli.app import app
    from tests.conftest import chat, write_jsonl

    log = write_jsonl(tmp_path / "log.jsonl", [chat(i, f"c{i}", 1, tenant="acme") for i in range(3)])
    (tmp_path / "prefixscan.toml").write_text('[analyze]\nhash_tenants = true\ntenant_key = "k-from-file-91"\n')
    r = CliRunner().invoke(app, ["analyze", str(log), "-o", str(tmp_path / "run"), "-q", "--json"])
    assert r.exit_code == 0, r.output
    assert list(json.loads(r.stdout)["by_tenant"]) == [tenant_hasher("k-from-file-91")("acme")]
    text = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").iterdir() if p.is_file())
    assert "k-from-file-91" not in text and "acme" not in text


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TERMINAL_ALPHABET = st.sampled_from(["\x1b", "[", "]", "\\", "\x07", "\x9b", "\x9d", "\r", "\b", "\n", "\t", "\u202e",
                                      "\u2066", "8", ";", "J", "m", "a", " ", "/", ":", "é"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(_TERMINAL_ALPHABET, max_size=40), st.text(max_size=40)))
def test_clean_never_lets_a_control_character_through(text: str) -> None:
    out = clean(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                   "\u2066\u2067\u2068\u2069" for c in out)
    assert clean(out) == out  # idempotent
    console = Console(width=500, emoji=False, color_system=None, record=True, force_terminal=False)
    console.print(safe(text), end="")  # markup in the data never breaks or styles the output
    # Every character of the data is shown (none read as markup); only backslashes may differ: Rich's escape
    # doubles a trailing one (so `[b]{value}[/b]` still closes) and reads `\[` as an escaped bracket.
    assert console.export_text().replace("\\", "") == out.replace("\\", "")


def test_prompt_lengths_a_token_or_two_apart_are_the_same_surroundings() -> None:
    """A clock or a counter that grows by a digit changes the prompt's length by a token: no new source.
    A template in front of questions of clearly different lengths is many sources."""
    from prefixscan.privacy import LENGTH_SLACK, independent_sources

    def count(lengths: list[int], users: list[str | None] | None = None) -> int:
        n = len(lengths)
        rows = pl.DataFrame({"g": [1] * n, "context": ["tail"] * n, "length": lengths,
                             "conversation_id": [f"inferred:{i}" for i in range(n)],
                             "user": pl.Series(users or [None] * n, dtype=pl.String)})
        return independent_sources(rows, "g").get(1, 0)

    assert LENGTH_SLACK >= 1
    assert count([250, 250, 251, 251, 252, 253, 254]) == 1  # one customer, the value grows (chained)
    assert count([100, 140, 180, 220, 260, 300]) == 6
    assert count([250] * 6, users=[f"u{i}" for i in range(6)]) == 6
    assert count([250] * 6, users=["u0"] * 3 + [None] * 3) == 2  # one user; the rest one surroundings
