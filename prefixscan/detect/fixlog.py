"""`fix`: rewrite a log in its own format with the breakers removed, then measure it again.

The operations come from the analysis of the original log (the same ones the counterfactual applied,
minus template-version unification, which is the team's decision). Every other byte of a record stays as
it was: only `messages` and `tools` change, inside whatever wrapper the shape uses.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from prefixscan.config import AnalyzeConfig
from prefixscan.detect.findings import fixable
from prefixscan.detect.rewrite import apply_ops
from prefixscan.errors import UsageError
from prefixscan.io.atomic import env_error, refuse_existing, replacing
from prefixscan.io.readers import RawError, read_source
from prefixscan.io.shapes import RecordError, normalise
from prefixscan.io.sources import check_output, expand
from prefixscan.pipeline.run import run_analysis


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

    def to_json(self) -> dict[str, Any]:
        return {"outputs": self.outputs, "requests": self.requests, "requests_rewritten": self.rewritten,
                "token_weighted_before": round(self.before, 6), "token_weighted_after": round(self.after, 6),
                "token_weighted_predicted": round(self.predicted, 6), "findings_before": self.findings_before,
                "findings_after": self.findings_after, "findings_by_kind": self.by_kind,
                "findings_not_fixed_by_kind": self.not_fixed}


def _container(obj: dict[str, Any], shape: str) -> tuple[dict[str, Any], str | None]:
    """The dict holding `messages`/`tools`, and the key it sits under when it is a JSON string."""
    key = {"openai-batch": "body", "gateway": "request"}.get(shape)
    if key is None:
        return obj, None
    inner = obj.get(key)
    if isinstance(inner, str):
        return orjson.loads(inner), key
    return inner, None


def _rewrite(obj: dict[str, Any], shape: str, ops: list[tuple]) -> bool:
    body, as_string = _container(obj, shape)
    raw_msgs = body.get("messages")
    raw_tools = body.get("tools")
    msgs = orjson.loads(raw_msgs) if isinstance(raw_msgs, str) else raw_msgs
    tools = orjson.loads(raw_tools) if isinstance(raw_tools, str) and raw_tools.strip() else raw_tools
    new_msgs, new_tools = apply_ops(msgs, tools, ops, counterfactual=False)
    if new_msgs == msgs and new_tools == tools:
        return False
    body["messages"] = orjson.dumps(new_msgs).decode() if isinstance(raw_msgs, str) else new_msgs
    if new_tools is not tools:
        body["tools"] = orjson.dumps(new_tools).decode() if isinstance(raw_tools, str) else new_tools
    if as_string is not None:
        obj[as_string] = orjson.dumps(body).decode()
    return True


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
    rewritten = requests = 0
    seen: set[str] = set()  # a duplicate id was rejected by the analysis: only its first occurrence is fixed
    for src, target in zip(sources, targets, strict=True):
        shape = shapes.get(src.path)
        rows: list[tuple[Any, bool]] = []
        for line, obj in read_source(src):
            requests += 1
            changed = False
            if not isinstance(obj, RawError) and shape is not None:
                try:
                    rid = normalise(obj, shape, src.path, line, overrides, {}).request_id
                except (RecordError, ValueError):
                    rid = None
                if rid is not None and rid not in seen and rid in ops:
                    changed = _rewrite(obj, shape, ops[rid])
                if rid is not None:
                    seen.add(rid)
            rewritten += changed
            rows.append((obj, changed))
        _write(src, target, rows)
    after = run_analysis(replace(cfg, inputs=tuple(targets), output=None, findings=True))
    by_kind: dict[str, int] = {}
    not_fixed: dict[str, int] = {}
    for f in fres.findings if fres is not None else []:
        into = by_kind if fixable(f) else not_fixed
        into[f.kind] = into.get(f.kind, 0) + 1
    return FixResult(
        outputs=targets, requests=requests, rewritten=rewritten,
        before=before.summary["hit_rate"]["token_weighted"], after=after.summary["hit_rate"]["token_weighted"],
        predicted=before.summary.get("counterfactual", {}).get("token_weighted_after_fixes", 0.0),
        findings_before=len(fres.findings) if fres is not None else 0,
        findings_after=len(after.findings.findings) if after.findings is not None else 0, by_kind=by_kind,
        not_fixed=not_fixed)


def _write(src: Any, target: str, rows: list[tuple[Any, bool]]) -> None:
    """Write rows in the source's own format; JSONL records that were not rewritten are copied byte for byte."""
    with replacing(target) as tmp:
        _write_to(src, str(tmp), rows)


def _write_to(src: Any, target: str, rows: list[tuple[Any, bool]]) -> None:
    if src.kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pq.read_schema(src.path)
        table = pa.Table.from_pylist([r for r, _ in rows if isinstance(r, dict)], schema=schema)
        pq.write_table(table, target, compression="zstd")
        return
    with open(src.path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    with open(src.path, "rb") as raw_f, open(target, "wb") as out_f:
        raw = gzip.GzipFile(fileobj=raw_f, mode="rb") if gz else raw_f
        out = gzip.GzipFile(filename="", mode="wb", fileobj=out_f, mtime=0) if gz else out_f
        originals = (ln for ln in raw if ln.strip())
        for (obj, changed), orig in zip(rows, originals, strict=True):
            if changed:
                out.write(orjson.dumps(obj) + b"\n")
            else:
                out.write(orig if orig.endswith(b"\n") else orig + b"\n")
        if gz:
            out.close()
