"""Shared fixtures: small hand-built logs and paths to the real traces."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
MOONCAKE = SHARED / "data" / "mooncake"


def write_jsonl(path: Path, records: list) -> Path:
    """Write dicts as JSON lines; str items are written verbatim (to make malformed lines)."""
    with open(path, "w") as f:
        for r in records:
            f.write(r if isinstance(r, str) else json.dumps(r))
            f.write("\n")
    return path


SYSTEM = "You are a careful assistant for ACME support. " * 20


def chat(i: int, conv: str, turns: int, tenant: str = "acme", ts: float | None = None, **extra) -> dict:
    msgs = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"Question {t} of conversation {conv}: how do I reset my password?"})
        if t < turns - 1:
            msgs.append({"role": "assistant", "content": f"Answer {t}: open settings, then security, then reset. " * 3})
    rec = {"request_id": f"r{i}", "timestamp": 1_700_000_000 + (ts if ts is not None else i), "tenant": tenant,
           "conversation_id": conv, "model": "m", "messages": msgs}
    rec.update(extra)
    return rec


@pytest.fixture
def chat_log(tmp_path: Path) -> Path:
    recs = []
    i = 0
    for turn in range(1, 4):
        for c in range(5):
            recs.append(chat(i, f"c{c}", turn, tenant="acme" if c < 3 else "globex"))
            i += 1
    return write_jsonl(tmp_path / "chat.jsonl", recs)


@contextmanager
def compiled(on: bool) -> Iterator[None]:
    """The compiled encode core on or off (its pure-Python reference) for the block: tests run both."""
    from prefixscan.encode import core as encode_core

    was = encode_core.ENABLED
    encode_core.ENABLED = on
    try:
        yield
    finally:
        encode_core.ENABLED = was
