"""`fix`: rewrite a log in its own format with the breakers removed, then measure it again.

The operations come from the analysis of the original log (the same ones the counterfactual applied,
minus template-version unification, which is the team's decision). Every other byte of a record stays as
it was: only `messages` and `tools` change, inside whatever wrapper the shape uses.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO

import orjson

from prefixscan.config import AnalyzeConfig
from prefixscan.detect.findings import fixable
from prefixscan.detect.reader import NO_TEXT, UNSEARCHED
from prefixscan.detect.rewrite import apply_ops
from prefixscan.errors import InputError, UsageError
from prefixscan.pipeline.run import run_analysis
from prefixscan.read.content import content_text
from prefixscan.read.fixmap import prompt_map
from prefixscan.read.otel import expand_otlp
from prefixscan.read.promptmap import Unmappable
from prefixscan.read.readers import DECODE_ERRORS, RawError, compression, layout, open_bytes, read_source
from prefixscan.read.record import Record, RecordError
from prefixscan.read.shapes import normalise
from prefixscan.read.sources import check_output, expand
from prefixscan.run.atomic import env_error, refuse_existing, replacing


@dataclass
class FixResult:
    """Before/after hit rates (token-weighted, ideal cache) and what was written."""

    outputs: list[str]
    requests: int
    rewritten: int
    before: float
    after: float
    predicted: float
    findings_before: int
    findings_after: int
    by_kind: dict[str, int] = field(default_factory=dict)  # findings `fix` rewrote, by kind
    not_fixed: dict[str, int] = field(default_factory=dict)  # findings with no safe rewrite, by kind
    unmapped: int = 0  # records whose rewrite could not be written into their own fields: left as they are

    def to_json(self) -> dict[str, Any]:
        return {"outputs": self.outputs, "requests": self.requests, "requests_rewritten": self.rewritten,
                "token_weighted_before": round(self.before, 6), "token_weighted_after": round(self.after, 6),
                "token_weighted_predicted": round(self.predicted, 6), "findings_before": self.findings_before,
                "findings_after": self.findings_after, "findings_by_kind": self.by_kind,
                "findings_not_fixed_by_kind": self.not_fixed, "requests_left_unmapped": self.unmapped}


# JSON text layouts the reader accepts but `fix` cannot write back record by record (readers.layout)
LAYOUTS = {"cr-lines": "JSON lines ended by CR alone", "array": "one JSON array",
           "objects": "concatenated (pretty-printed) JSON objects"}


def _rewrite(obj: dict[str, Any], shape: str, rec: Record, ops: list[tuple],
             overrides: dict[str, str]) -> dict[str, Any] | None | bool:
    """The record rewritten in its own shape; None when the operations change nothing; False when the
    change cannot be written into the record's own fields (then it is left as it is).

    The operations address the normalised message list (`rewrite.apply_ops`); `prompt_map` says where each
    of those messages has its text in this record, and the result is checked by normalising it again: it
    must give exactly the messages and tools the counterfactual measured."""
    msgs = rec.messages or []
    new_msgs, new_tools = apply_ops(msgs, rec.tools, ops, counterfactual=False)
    old_texts = [content_text(m.get("content")) for m in msgs]
    new_texts = [content_text(m.get("content")) for m in new_msgs]
    changed = [i for i, (a, b) in enumerate(zip(old_texts, new_texts, strict=True)) if a != b]
    if not changed and new_tools == rec.tools:
        return None
    try:
        pm = prompt_map(obj, shape, overrides)
    except Unmappable:
        return False
    if len(pm.messages) != len(msgs):
        return False
    for mi in changed:
        if not pm.write_text(mi, old_texts[mi], new_texts[mi]):
            return False
    if new_tools != rec.tools and not pm.write_tools(rec.tools or [], new_tools or []):
        return False
    out = pm.finish()
    try:
        again = normalise(out, shape, rec.source_file, rec.source_line, overrides, {})
    except (RecordError, ValueError):
        return False
    if [content_text(m.get("content")) for m in again.messages or []] != new_texts or again.tools != new_tools \
            or [m.get("role") for m in again.messages or []] != [m.get("role") for m in new_msgs]:
        return False
    return out


def _targets(paths: list[str], output: str) -> list[str]:
    """One input: the output file (or that name inside an existing directory); several: a directory."""
    if len(paths) == 1:
        return [os.path.join(output, os.path.basename(paths[0])) if os.path.isdir(output) else output]
    names = [os.path.basename(p) for p in paths]
    if len(set(names)) != len(names):
        raise UsageError("input files share a file name; fix them one at a time")
    if os.path.lexists(output) and not os.path.isdir(output):
        raise UsageError(f"{output} is a file; several inputs need an output directory")
    return [os.path.join(output, n) for n in names]


def fix_logs(cfg: AnalyzeConfig, output: str, force: bool = False) -> FixResult:
    """Analyse `cfg.inputs`, write the rewritten log(s) to `output`, re-analyse them. Every output is
    checked before any work: none may be (or be inside a directory given as) an input, and an existing
    one needs `force`; each file is written under a temporary name and renamed, so a failure leaves no
    partial file and an input is never opened for writing."""
    sources = expand(list(cfg.inputs))
    targets = _targets([s.path for s in sources], output)
    check_output(output, cfg.inputs, sources)
    for t in targets:
        check_output(t, cfg.inputs, sources)
        refuse_existing(t, force)
    before = run_analysis(replace(cfg, output=None, findings=True))
    fres = before.findings
    ops = fres.ops if fres is not None else {}
    if len(targets) > 1:
        try:
            os.makedirs(output, exist_ok=True)
        except OSError as exc:
            raise env_error(exc, output) from None
    overrides = dict(cfg.fields)
    shapes = before.summary["input"]["shapes"]
    for src in sources:
        shape = shapes.get(src.path)
        how = layout(src.path) if src.kind != "parquet" else "lines"
        if how != "lines":
            raise InputError(f"{src.path} holds {LAYOUTS[how]}: fix writes JSON lines back line by line and "
                             "cannot keep that layout; convert it to JSON lines first; nothing was written")
        if shape in NO_TEXT:
            raise InputError(f"{src.path} is {NO_TEXT[shape]} ({shape}): it holds no prompt text, so there is "
                             "nothing `fix` could rewrite; nothing was written")
    if sources and all(shapes.get(s.path) in UNSEARCHED for s in sources):
        raise InputError(f"{sources[0].path} holds completion prompts: cache breakers are searched for in chat "
                         "messages only, so there is nothing `fix` could rewrite; nothing was written")
    rewritten = requests = unmapped = 0
    seen: set[str] = set()  # a duplicate id was rejected by the analysis: only its first occurrence is fixed
    for src, target in zip(sources, targets, strict=True):
        shape = shapes.get(src.path)
        rows: list[tuple[int, Any, bool]] = []
        for line, obj in read_source(src):
            requests += 1
            new = None
            if not isinstance(obj, RawError) and shape is not None:
                try:
                    rec = normalise(obj, shape, src.path, line, overrides, {})
                except (RecordError, ValueError):
                    rec = None
                rid = rec.request_id if rec is not None else None
                if rec is not None and rid not in seen and rid in ops:
                    new = _rewrite(obj, shape, rec, ops[rid], overrides)
                    if new is False:
                        unmapped += 1
                        new = None
                if rid is not None:
                    seen.add(rid)
            rewritten += new is not None
            rows.append((line, obj if new is None else new, new is not None))
        _write(src, target, rows)
    after = run_analysis(replace(cfg, inputs=tuple(targets), output=None, findings=True))
    by_kind: dict[str, int] = {}
    not_fixed: dict[str, int] = {}
    for f in fres.findings if fres is not None else []:
        into = by_kind if fixable(f) else not_fixed
        into[f.kind] = into.get(f.kind, 0) + 1
    rate = before.summary["hit_rate"]["token_weighted"]
    cf = before.summary.get("counterfactual") or {}
    return FixResult(
        outputs=targets, requests=requests, rewritten=rewritten, before=rate,
        after=after.summary["hit_rate"]["token_weighted"],
        # nothing to rewrite (e.g. completions: only chat messages are searched for breakers): no gain predicted
        predicted=cf.get("token_weighted_after_fixes", rate) if cf.get("requests_rewritten") else rate,
        findings_before=len(fres.findings) if fres is not None else 0,
        findings_after=len(after.findings.findings) if after.findings is not None else 0, by_kind=by_kind,
        not_fixed=not_fixed, unmapped=unmapped)


def _write(src: Any, target: str, rows: list[tuple[int, Any, bool]]) -> None:
    """Write rows in the source's own format and compression, under a temporary name renamed into place;
    JSONL lines with no rewritten record are copied byte for byte."""
    with replacing(target) as tmp:
        if src.kind == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = pq.read_schema(src.path)
            table = pa.Table.from_pylist([r for _, r, _ in rows if isinstance(r, dict)], schema=schema)
            pq.write_table(table, str(tmp), compression="zstd")
            return
        kind = compression(src.path)
        with open(tmp, "wb") as out_f:
            if kind == "gzip":
                out: gzip.GzipFile | BinaryIO = gzip.GzipFile(filename="", mode="wb", fileobj=out_f, mtime=0)
            elif kind == "zstd":
                import pyarrow as pa

                out = pa.CompressedOutputStream(pa.PythonFile(out_f, mode="w"), "zstd")
            else:
                out = out_f
            try:
                for data in _lines(src.path, rows):
                    out.write(data)
            finally:
                if out is not out_f:
                    out.close()


def _lines(path: str, rows: list[tuple[int, Any, bool]]) -> Iterator[bytes]:
    """The file's lines again, numbered as `read_jsonl` numbers them; a line holding a rewritten record is
    written from it (an OTLP export line: its spans, in order, with the rewritten ones replaced)."""
    changed: dict[int, list[tuple[int, Any]]] = {}
    per_line: dict[int, int] = {}
    for line, obj, ch in rows:
        k = per_line.get(line, 0)
        per_line[line] = k + 1
        if ch:
            changed.setdefault(line, []).append((k, obj))
    with open_bytes(path) as f:
        try:
            for lineno, orig in enumerate(f, start=1):  # copied, or written from its rewritten record(s)
                new = changed.get(lineno)
                if new is None:
                    yield orig if orig.endswith(b"\n") else orig + b"\n"
                    continue
                if per_line[lineno] == 1 and new[0][0] == 0:
                    yield orjson.dumps(new[0][1]) + b"\n"
                    continue
                whole = orjson.loads(orig)
                spans = expand_otlp(whole) or []
                for k, span in new:
                    spans[k].clear()
                    spans[k].update(span)
                yield orjson.dumps(whole) + b"\n"
        except DECODE_ERRORS as exc:
            raise InputError(f"{path} cannot be decompressed to its end ({str(exc)[:120] or type(exc).__name__}): "
                             "fix copies every line, so nothing was written") from None
