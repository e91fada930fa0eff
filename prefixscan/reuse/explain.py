"""`explain`: why one request hit or missed, block by block, from a run directory.

For each run of blocks: hit or not, and which earlier request (tenant, conversation) first computed them;
where the prompt diverged from the best earlier match (its source request: message, role, character,
token) and which findings explain it; the request's row of the `misses` attribution. The run directory
holds no text: the divergence inside messages needs the original log, which is re-read at the two
requests' lines (`source_file`, `source_line`) when it is still there. A hashed trace explains by blocks
only. No customer text is shown unless `include_text`: offsets, lengths and hashes instead.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import xxhash

from prefixscan.affixes import common_prefix_length
from prefixscan.encode.hashing import counted_hit_blocks
from prefixscan.errors import UsageError
from prefixscan.read.content import content_text
from prefixscan.run.load import load_run

CONTEXT = 40  # characters either side of a divergence shown with include_text


@dataclass
class BlockRun:
    """Consecutive blocks [first, last] with the same outcome and the same first computing request."""

    first: int
    last: int
    status: str  # "hit", "seen_recomputed" (vLLM recomputes the last prompt token's block), "miss"
    first_request_id: str | None = None
    first_tenant: str | None = None
    first_conversation_id: str | None = None


@dataclass
class Divergence:
    """Where the prompt stops matching its best earlier match (the source request)."""

    against_request_id: str | None
    token: int
    block: int
    message_index: int | None = None  # None: no text to compare (hashed trace, log gone)
    role: str | None = None
    char_offset: int | None = None
    this_length: int | None = None  # characters of the message here and in the earlier request
    other_length: int | None = None
    this_hash: str | None = None  # xxh3-64 of each message's text, to compare without showing it
    other_hash: str | None = None
    this_text: str | None = None  # with include_text only: context around the divergence
    other_text: str | None = None
    note: str | None = None


@dataclass
class Explanation:
    """Everything `prefixscan explain` prints; `to_json` is the `--json` interface."""

    request_id: str
    seq: int
    tenant: str | None
    conversation_id: str | None
    conversation_inferred: bool
    replica: str | None
    prompt_tokens: int
    blocks: int
    block_size: int
    cached_tokens: int
    hit_source: str
    prefix_class: str
    runs: list[BlockRun]
    divergence: Divergence | None
    findings: list[dict[str, Any]] = field(default_factory=list)
    misses: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Explainer:
    """A run directory opened once to explain any number of its requests."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run = load_run(run_dir)
        cfg = self.run.manifest.get("config", {})
        self.block_size = int(cfg.get("block_size", 16))
        self.rule = cfg.get("hit_rule", "vllm")
        self.shapes = (self.run.analysis.summary.get("input") or {}).get("shapes", {})
        self.overrides = dict(cfg.get("fields") or {})
        req = self.run.table("requests")
        self.req = req.drop_columns(["block_hashes"])
        lists = req.column("block_hashes").combine_chunks()
        self.offsets = lists.offsets.to_numpy().astype(np.int64)
        self.flat = lists.values.to_numpy()[self.offsets[0]:self.offsets[-1]]
        self.offsets = self.offsets - self.offsets[0]
        self.ids = self.req.column("request_id").to_pylist()
        self.row_of = {r: i for i, r in enumerate(self.ids)}
        # First computing request of every distinct block: its first occurrence in analysis order.
        self.uniq, first = np.unique(self.flat, return_index=True)
        self.first_row = np.searchsorted(self.offsets, first, side="right") - 1
        self._cols = {c: self.req.column(c).to_pylist() for c in
                      ("tenant", "conversation_id", "source_file", "source_line")}
        self.findings = self.run.table("findings").to_pylist() if self.run.has("findings") else []
        fr = self.run.table("finding_requests") if self.run.has("finding_requests") else None
        self.gains: dict[str, list[tuple[int, int]]] = {}
        if fr is not None:
            for rank, rid, g in zip(*(fr.column(c).to_pylist() for c in ("rank", "request_id", "tokens_gained")),
                                    strict=True):
                self.gains.setdefault(rid, []).append((rank, g))
        self.misses = self.run.table("misses") if self.run.has("misses") else None

    def explain(self, request_id: str, include_text: bool = False) -> Explanation:
        """The explanation of one request (UsageError when the run has no such request)."""
        i = self.row_of.get(request_id)
        if i is None:
            raise UsageError(f"request {request_id!r} is not in run {self.run.path} "
                             f"(e.g. {', '.join(self.ids[:3])}); ids are the requests table's request_id")
        row = {c: self.req.column(c)[i].as_py() for c in self.req.column_names}
        h = self.flat[self.offsets[i]:self.offsets[i + 1]]
        runs = self._runs(i, h, int(row["cached_blocks"]), int(row["cached_tokens"]))
        div = self._divergence(i, row, include_text)
        ex = Explanation(
            request_id=request_id, seq=int(row["seq"]), tenant=row["tenant"],
            conversation_id=row["conversation_id"], conversation_inferred=bool(row.get("conversation_inferred")),
            replica=row.get("replica"), prompt_tokens=int(row["prompt_tokens"]), blocks=len(h),
            block_size=self.block_size, cached_tokens=int(row["cached_tokens"]), hit_source=row["hit_source"],
            prefix_class=row["prefix_class"], runs=runs, divergence=div, findings=self._findings(request_id, div),
            misses=self._misses(i))
        if div is not None and div.note:
            ex.notes.append(div.note)
        return ex

    def _runs(self, i: int, h: np.ndarray, cached_blocks: int, cached_tokens: int) -> list[BlockRun]:
        """Blocks grouped by outcome and first computing request."""
        if len(h) == 0:
            return []
        pos = np.searchsorted(self.uniq, h)
        first = self.first_row[pos]
        hit_blocks = counted_hit_blocks(cached_tokens, cached_blocks, self.block_size, self.rule)
        out: list[BlockRun] = []
        for j in range(len(h)):
            src = int(first[j]) if j < cached_blocks and first[j] < i else None
            status = "miss" if src is None else ("hit" if j < hit_blocks else "seen_recomputed")
            who = ((self.ids[src], self._cols["tenant"][src], self._cols["conversation_id"][src]) if src is not None
                   else (None, None, None))
            if out and out[-1].status == status and out[-1].first_request_id == who[0]:
                out[-1].last = j
            else:
                out.append(BlockRun(j, j, status, *who))
        return out

    def _divergence(self, i: int, row: dict[str, Any], include_text: bool) -> Divergence | None:
        src_id = row.get("source_request_id")
        k = int(row["cached_blocks"])
        n_blocks = int(self.offsets[i + 1] - self.offsets[i])
        if k >= n_blocks and src_id is not None:
            return None  # every block was seen: nothing diverged
        d = Divergence(src_id, int(row["divergence_token"]), k)
        if n_blocks == 0:
            d.note = "the prompt is shorter than one block: nothing can be cached"
            return d
        if src_id is None:
            d.note = "no earlier request shares the first block: the prompt diverges from every earlier one at block 0"
            return d
        j = self.row_of[src_id]
        recs = self._records([i, j])
        if recs is None:
            files = {self._cols["source_file"][r] for r in (i, j)}
            hashed = all(self.shapes.get(f) in ("mooncake", "bailian") for f in files)
            d.note = ("blocks only: a hashed trace carries no text" if hashed else
                      "blocks only: the run holds no text and the log is not at its recorded path (or has no "
                      "messages)")
            return d
        a, b = recs
        _locate(d, a, b, include_text)
        return d

    def _records(self, rows: list[int]) -> list[Any] | None:
        """The parsed Records of some rows, re-read from the log (None when there is no text to read)."""
        from prefixscan.read.readers import RawError, read_source
        from prefixscan.read.shapes import normalise
        from prefixscan.read.sources import expand

        want = {(self._cols["source_file"][r], int(self._cols["source_line"][r])): r for r in rows}
        found: dict[int, Any] = {}
        for path in sorted({p for p, _ in want}):
            shape = self.shapes.get(path)
            if shape in (None, "mooncake", "bailian") or not os.path.exists(path):
                return None
            lines = {ln for p, ln in want if p == path}
            for line, obj in read_source(expand([path])[0]):
                if line in lines and not isinstance(obj, RawError):
                    found[want[(path, line)]] = normalise(obj, shape, path, line, self.overrides, {})
                    if len(lines) == 1:
                        break
                    lines.discard(line)
        if any(r not in found or found[r].messages is None and found[r].prompt is None for r in rows):
            return None
        return [found[r] for r in rows]

    def _findings(self, request_id: str, div: Divergence | None) -> list[dict[str, Any]]:
        """Findings whose fix rewrites this request, with what they gain on it; `at_divergence` marks the
        one that explains the divergence: in the diverging message, the last one starting at or before
        the diverging character (offsets are the finding's example request's, so close, not exact)."""
        by_rank = {f["rank"]: f for f in self.findings}
        out = []
        for rank, gain in sorted(self.gains.get(request_id, []), key=lambda x: (-x[1], x[0])):
            f = by_rank.get(rank)
            if f is None:
                continue
            out.append({"rank": rank, "kind": f["kind"], "message_index": f.get("message_index"),
                        "char_offset": f.get("char_offset"), "token_offset": f.get("token_offset"),
                        "tokens_gained": gain, "fix": f["fix"], "at_divergence": False})
        if div is not None and div.message_index is not None:
            here = [f for f in out if f["message_index"] == div.message_index]
            before = [f for f in here if (f["char_offset"] or 0) <= (div.char_offset or 0)]
            pick = max(before, key=lambda f: f["char_offset"] or 0) if before else (
                min(here, key=lambda f: f["char_offset"] or 0) if here else None)
            if pick is not None:
                pick["at_divergence"] = True
        return out

    def _misses(self, i: int) -> dict[str, Any] | None:
        if self.misses is None:
            return None
        row = {c: self.misses.column(c)[i].as_py() for c in self.misses.column_names}
        return {k: v for k, v in row.items() if k not in ("seq", "request_id")}


def _texts(rec: Any) -> list[tuple[str, str]]:
    """(role, text) per message; the tool list counts as one message after the system messages."""
    if rec.messages is None:
        return [("prompt", rec.prompt or "")]
    return [(str(m.get("role", "")), content_text(m.get("content"))) for m in rec.messages]


def _hash(s: str) -> str:
    return xxhash.xxh3_64_hexdigest(s.encode("utf-8", "surrogatepass"))[:12]


def _locate(d: Divergence, a: Any, b: Any, include_text: bool) -> None:
    """Fill the message and character where `a` first differs from `b`."""
    ta, tb = _texts(a), _texts(b)
    if (a.tools or None) != (b.tools or None):
        d.note = "the tool lists differ (the tool list is rendered before the first user message)"
    for mi, ((ra, xa), (rb, xb)) in enumerate(zip(ta, tb, strict=False)):
        if ra != rb or xa != xb:
            _fill(d, mi, ra, common_prefix_length(xa, xb), xa, xb, include_text)
            return
    if len(ta) != len(tb):
        mi = min(len(ta), len(tb))
        longer = ta if len(ta) > len(tb) else tb
        _fill(d, mi, longer[mi][0], 0, ta[mi][1] if mi < len(ta) else "", tb[mi][1] if mi < len(tb) else "",
              include_text)
        d.note = d.note or ("the earlier request ends here; this one goes on" if len(ta) > len(tb)
                            else "this request ends where the earlier one goes on")
    elif d.note is None:
        d.note = "the messages are equal: the difference is in the rendering (template, tools or tokenizer)"


def _fill(d: Divergence, mi: int, role: str, c: int, xa: str, xb: str, include_text: bool) -> None:
    d.message_index, d.role, d.char_offset = mi, role, c
    d.this_length, d.other_length, d.this_hash, d.other_hash = len(xa), len(xb), _hash(xa), _hash(xb)
    if include_text:
        lo = max(0, c - CONTEXT)
        d.this_text, d.other_text = xa[lo:c + CONTEXT], xb[lo:c + CONTEXT]


def explain(run_dir: str | os.PathLike[str], request_id: str, include_text: bool = False) -> Explanation:
    """Python API of `prefixscan explain RUN REQUEST_ID` (`run_dir`: a path or a `Run`)."""
    return Explainer(run_dir).explain(request_id, include_text)


__all__ = ["BlockRun", "Divergence", "Explainer", "Explanation", "explain"]
