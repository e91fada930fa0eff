"""The one call `analyze` makes: finalise the ingest-fed detector into a FindingsResult, then name each
finding's place in the record's own shape and apply the privacy rule to its text.

Where (`locate_fields`): findings locate a breaker in the normalised message list (message index, char).
For shapes whose records are not that list (Anthropic `system`, Responses `instructions`/`input`, OTel
attributes, wrappers), the example request is read again and `prompt_map` (beside the converters) names the
field that holds the char (`system[0].text` char 146), for the fix sentence. Only the example records are
parsed: one read of each such file up to its last example line.

What may leave the run (`guard_findings`): a dynamic field's label ("Signature", "Dear ...") is the template
text in front of the varying value; it is shown (redacted) only when the finding's requests come from at
least k independent sources (`prefixscan.privacy.may_show`): distinct users, else tenants and prompts of
different lengths (the label's surroundings differ), a conversation being one source; otherwise it is
replaced by a `hidden()` marker in the label, the example and the fix. A normalisation drift's example
quotes one request's line, whose sharing is not known: the line is always hidden. An id-like value (an
account number, a phone) is shown as its kind only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from prefixscan.config import AnalyzeConfig
from prefixscan.detect.accumulate import Acc, merge_aliases, token_offset
from prefixscan.detect.counterfactual import Blocks, Counterfactual, run_counterfactual
from prefixscan.detect.detector import Detector
from prefixscan.detect.findings import CATEGORIES, Finding, finding_requests_table, findings_table, fix_sentence, rank
from prefixscan.privacy import IDENTITY_COLUMNS, identity_hasher, independent_sources, may_show
from prefixscan.read.content import content_text
from prefixscan.read.fixmap import prompt_map
from prefixscan.read.promptmap import Unmappable
from prefixscan.read.readers import RawError, read_source
from prefixscan.read.record import RecordError
from prefixscan.read.shapes import normalise
from prefixscan.read.sources import Source
from prefixscan.redact import hidden, redact
from prefixscan.reuse.ideal import ideal_reuse, scope_salts

OWN_LIST = ("chat", "completion", "tokens", "mooncake", "bailian")  # the message list is the record's own
_LINE_KINDS = ("whitespace", "line_endings", "unicode", "json_key_order")  # examples that quote a line
_ID_KINDS = ("request_id", "session_id", "random_token", "phone", "email", "user_name")  # values never shown
_WS = re.compile(r"\s+")

MIN_REQUESTS = 2
MAX_CHURN_VERSIONS = 8


@dataclass
class FindingsResult:
    """Ranked findings, the counterfactual, and per-request rewrite operations (for `fix`)."""

    findings: list[Finding]
    counterfactual: Counterfactual
    ops: dict[str, list[tuple]] = field(default_factory=dict)
    seconds: float = 0.0

    def tables(self) -> dict[str, pa.Table]:
        return {"findings": findings_table(self.findings), "finding_requests": finding_requests_table(self.findings)}

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.findings]


def _kind(acc: Acc) -> str | None:
    if acc.key[0] in ("drift", "order"):
        return acc.key[2]
    votes = {k: v for k, v in acc.kinds.items() if k}
    if acc.prose and acc.prose * 2 >= sum(acc.kinds.values()):
        return "template_churn" if len(acc.values) <= MAX_CHURN_VERSIONS else "pattern_free"
    if not votes:
        return "pattern_free"
    kind = max(sorted(votes), key=lambda k: votes[k])
    if kind == "random_token" and acc.ints >= 3 and acc.increases >= 0.8 * (acc.ints - 1):
        return "counter"
    return kind


def _candidate(acc: Acc) -> bool:
    if acc.key[0] == "span":
        return len(acc.requests) >= MIN_REQUESTS and len(acc.values) >= 2
    return len(acc.requests) >= 1


def finalize(det: Detector | None, req: pl.DataFrame, blocks: Blocks, block_size: int,
             rule: str, hash_tenants: Callable[[str], str | None] | None = None,
             baseline: np.ndarray | None = None) -> FindingsResult:
    """Findings for a finished analysis: counterfactual re-analysis, credit, thresholds, ranking.
    `hash_tenants`: the run's keyed tenant hash (`privacy.tenant_hasher`), None to keep names."""
    t0 = time.perf_counter()
    findings: list[Finding] = []
    cf = Counterfactual()
    ops: dict[str, list[tuple]] = {}
    if det is not None and det.fed:
        det.retro_exemplars()
        det.retro_lists()
        det.flush(det.tokenizer)
        alias = merge_aliases(det.accs)
        if alias:
            det.alias_keys(alias)
        set_keys = det.opset_keys()
        for rid, sid in det.ops_of.items():  # normalisers were applied before their drift was first seen
            for k in set_keys[sid]:
                if k[0] == "drift" and k in det.accs:
                    det.accs[k].add_request(rid)
        cands = {k: a for k, a in det.accs.items() if _candidate(a)}
        set_cands = [[k for k in ks if k in cands] for ks in set_keys]
        keys = {rid: set_cands[sid] for rid, sid in det.ops_of.items() if set_cands[sid]}
        rewritten = {rid: det.rewritten[rid] for rid in keys if rid in det.rewritten}
        cf = run_counterfactual(req, blocks, block_size, rule, rewritten, keys, baseline)
        for key in sorted(cands, key=repr):
            acc = cands[key]
            credit = cf.credit.get(key, {})
            lost = sum(credit.values())
            if lost < block_size:
                continue
            kind = _kind(acc) or "pattern_free"
            detail = None
            if acc.detail == "inline" and kind in ("timestamp", "date"):
                detail = "written inside a sentence: no safe automatic rewrite"
            if kind == "list_order":
                detail = acc.detail
            if kind == "template_churn":
                counts = sorted(acc.values.values(), reverse=True)
                detail = f"{len(counts)} versions serve {'/'.join(map(str, counts))} requests"
            tenant = (hash_tenants(acc.tenant) if hash_tenants is not None else acc.tenant) if acc.tenant else None
            offset = acc.char_offset
            acc.token_offset = token_offset(det.tokenizer, acc)
            findings.append(Finding(
                kind=kind, tenant=tenant, family=acc.family or None, label=acc.label or None,
                message_index=acc.mi, role=acc.role, char_offset=offset, token_offset=acc.token_offset,
                block_index=acc.token_offset // block_size if acc.token_offset is not None else None,
                requests_affected=len(acc.requests), distinct_values=len(acc.values) if key[0] == "span" else None,
                tokens_lost=int(lost), example=acc.example, example_request_id=acc.example_request_id,
                detail=detail, fix=fix_sentence(kind, acc.label or None, acc.role, detail, acc.mi, offset),
                request_ids=list(acc.requests), request_gains=[int(credit.get(r, 0)) for r in acc.requests],
            ))
        kept = {k for k in cands if sum(cf.credit.get(k, {}).values()) >= block_size}
        shared: dict[int, list[tuple]] = {}  # one list per operation set (`fix` only reads them)
        for rid, sid in det.ops_of.items():
            if any(k in kept for k in set_keys[sid]):
                if sid not in shared:
                    shared[sid] = det.kept_ops(sid, kept)
                ops[rid] = shared[sid]
        if det.errors:
            cf.detector_errors = det.errors
    findings = rank(findings)
    return FindingsResult(findings, cf, ops, (det.seconds if det else 0.0) + time.perf_counter() - t0)



def run_findings(cfg: AnalyzeConfig, ing: Any, req: pl.DataFrame, blocks: Blocks,
                 requests: Path | None = None) -> FindingsResult | None:
    """Findings for an analysis, or None with --no-findings. `blocks`: every request's hashes, chunk by
    chunk in row order (`counterfactual.Blocks`); `requests`: the requests table (to name a finding's
    field in the record's own shape)."""
    if not cfg.findings:
        return None
    baseline = None
    if cfg.granularity == "token" and req.height and ing.detector is not None and ing.detector.fed:
        # The counterfactual is block-granular; compare it with a block-granular baseline.
        blocks = list(blocks)
        offsets, flat = _joined(blocks)
        baseline = ideal_reuse(offsets, flat, req["prompt_tokens"].to_numpy(), ing.block_size, ing.hit_rule,
                               scope_salts(req["tenant"].to_list()),
                               scope_salts(req["conversation_id"].to_list())).cached_tokens
    res = finalize(ing.detector, req, blocks, ing.block_size, ing.hit_rule, identity_hasher(cfg), baseline)
    locate_fields(res.findings, requests, ing.sources, ing.shapes, dict(cfg.fields))  # `system[0].text` char 146
    guard_findings(res.findings, req, cfg.snippet_k, cfg.include_text)  # example text only as privacy allows
    return res


def _joined(chunks: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive (local CSR offsets, hashes) chunks as one CSR pair."""
    if not chunks:
        return np.zeros(1, np.int64), np.zeros(0, np.uint64)
    offs, base = [np.zeros(1, np.int64)], 0
    for off, _ in chunks:
        offs.append(off[1:] + base)
        base += int(off[-1])
    return np.concatenate(offs), np.concatenate([f for _, f in chunks])


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


def guard_findings(findings: list[Finding], req: pl.DataFrame, k: int, include_text: bool) -> None:
    """Apply the privacy rule to each finding's text, in place. `req`: the analysis' requests (request_id,
    the identity columns and prompt_tokens; missing ones count as absent: then only users vouch)."""
    if include_text:
        return
    sources = _sources(findings, req)
    for i, f in enumerate(findings):
        if f.kind in _LINE_KINDS and f.message_index is not None and f.message_index >= 0:
            _hide_line(f)
        elif f.label:
            _guard_label(f, may_show(sources.get(i, 0), k))


def _sources(findings: list[Finding], req: pl.DataFrame) -> dict[int, int]:
    """Independent sources of each labelled finding's requests. A finding's value varies by definition,
    so its label's surroundings are told apart by the rest of the prompt: its length in tokens."""
    pairs = [(i, r) for i, f in enumerate(findings) if f.label for r in f.request_ids]
    if not pairs or not req.height or "request_id" not in req.columns:
        return {}
    cols = [c for c in (*IDENTITY_COLUMNS, "prompt_tokens") if c in req.columns]
    needed = list({r for _, r in pairs})  # a few rows of a large log
    who = req.select("request_id", *cols).filter(pl.col("request_id").is_in(needed)).unique("request_id",
                                                                                             keep="first")
    if "prompt_tokens" not in who.columns:
        who = who.with_columns(pl.lit(None, dtype=pl.Int64).alias("prompt_tokens"))
    rows = (pl.DataFrame({"_finding": [i for i, _ in pairs], "request_id": [r for _, r in pairs]},
                         schema={"_finding": pl.Int64, "request_id": pl.String})
            .join(who, on="request_id", how="inner").rename({"prompt_tokens": "length"})
            .with_columns(pl.lit("").alias("context")))
    return independent_sources(rows, "_finding")


def _guard_label(f: Finding, shared: bool) -> None:
    """`label: value`: the label stays (redacted) when shared, else a marker; an id-like value shows only
    its kind (a timestamp keeps its redacted shape: `November ##, #### ##:##`)."""
    label = f.label or ""
    shown = redact(_WS.sub(" ", label)).strip()
    ex = f.example or ""
    value = ex[len(shown) + 2:] if shown and ex.startswith(shown + ": ") else None
    if f.kind in _ID_KINDS:
        value = f"<{f.kind}>"
    if shared:
        f.example = f"{shown}: {value}" if value is not None else ex
        return
    mark = hidden(len(label))
    f.example = f"{mark}: {value}" if value is not None else mark
    f.label = mark
    if CATEGORIES.get(f.kind, "dynamic_field") in ("dynamic_field", "pattern_free"):
        f.fix = fix_sentence(f.kind, None, f.role, f.detail, f.message_index, f.char_offset, f.field_path,
                             hidden_label=len(label))


def _hide_line(f: Finding) -> None:
    ex = f.example or ""
    head, sep, line = ex.partition(": ")
    f.example = f"{head}: {hidden(len(line))}" if sep and head == f.kind else hidden(len(ex))
