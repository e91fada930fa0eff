"""Name a finding's place in the record's own shape (`system[0].text` char 146), for its fix sentence.

Findings locate a breaker in the normalised message list (message index, char). For shapes whose records
are not that list (Anthropic `system`, Responses `instructions`/`input`, OTel attributes, wrappers), the
example request is read again and `prompt_map` (beside the converters) names the field that holds the
char. Only the example records are parsed: one read of each such file up to its last example line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from prefixscan.detect.findings import Finding, fix_sentence
from prefixscan.read.content import content_text
from prefixscan.read.fixmap import prompt_map
from prefixscan.read.promptmap import Unmappable
from prefixscan.read.readers import RawError, read_source
from prefixscan.read.record import RecordError
from prefixscan.read.shapes import normalise
from prefixscan.read.sources import Source

OWN_LIST = ("chat", "completion", "tokens", "mooncake", "bailian")  # the message list is the record's own


def locate_fields(findings: list[Finding], requests: Path | None, sources: list[Source], shapes: dict[str, str],
                  overrides: dict[str, str]) -> None:
    """Set `field_path` (and the fix sentence) of each finding whose example comes from a shape of its own.
    `requests`: the run's requests table (where each request id was read)."""
    want: dict[str, list[Finding]] = {}
    for f in findings:
        if f.example_request_id and f.message_index is not None and f.message_index >= 0 \
                and f.char_offset is not None:
            want.setdefault(f.example_request_id, []).append(f)
    if not want or requests is None or all(s in OWN_LIST for s in shapes.values()):
        return
    rows = pl.scan_parquet(requests).select("request_id", "source_file", "source_line").filter(
        pl.col("request_id").is_in(list(want))).collect()
    lines: dict[str, dict[int, list[str]]] = {}
    for rid, path, line in rows.iter_rows():
        if shapes.get(path) not in OWN_LIST and shapes.get(path) is not None:
            lines.setdefault(path, {}).setdefault(int(line), []).append(rid)
    for src in sources:
        need = lines.get(src.path)
        if not need:
            continue
        last = max(need)
        for line, obj in read_source(src):
            if line > last:
                break
            if line in need and not isinstance(obj, RawError):
                _locate(obj, shapes[src.path], src.path, line, overrides, need[line], want)


def _locate(obj: dict[str, Any], shape: str, path: str, line: int, overrides: dict[str, str], rids: list[str],
            want: dict[str, list[Finding]]) -> None:
    try:
        rec = normalise(obj, shape, path, line, overrides, {})
        pm = prompt_map(obj, shape, overrides)
    except (RecordError, Unmappable, ValueError):
        return
    if rec.request_id not in rids or not rec.messages:
        return
    for f in want.get(rec.request_id, []):
        if f.message_index >= len(rec.messages):  # type: ignore[operator]
            continue
        mi = f.message_index
        where = pm.locate(mi, content_text(rec.messages[mi].get("content")), f.char_offset)  # type: ignore[arg-type,index]  # `want`: set
        if where is not None:
            f.field_path = where
            if f.fix.startswith(("Move", "No safe")):
                f.fix = fix_sentence(f.kind, f.label, f.role, f.detail, mi, f.char_offset, where)
