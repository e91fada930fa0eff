"""The records of one input file that a Ray encode actor encodes: read and normalised as the pipeline's
read stage does, text only. An actor imports only the readers and the encoder (0.5 s), not the pipeline
with polars and numba (2 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prefixscan.config import AnalyzeConfig
from prefixscan.read.readers import RawError, read_source
from prefixscan.read.record import Record, RecordError
from prefixscan.read.shapes import detect, normalise
from prefixscan.read.sources import Source

HASHED_SHAPES = ("mooncake", "bailian")  # records that arrive hashed: nothing to encode


def _file_shape(cfg: AnalyzeConfig) -> str | None:
    """The shape the read stage assumes for every file before looking at it (`pipeline.read.Reader`)."""
    overrides = dict(cfg.fields)
    if cfg.format != "auto":
        return cfg.format
    if "messages" in overrides:
        return "chat"
    if "prompt" in overrides:
        return "completion"
    return None


def text_records(cfg: AnalyzeConfig, src: Source) -> Iterator[tuple[int, Record]]:
    """The records of one file that the encode stage will see: parsed and normalised as ingest does, text
    only (hashed traces need no encoding). What ingest would reject is skipped here; ingest rejects it
    again with its file, line and reason, so nothing is lost by skipping. Yields (ordinal, record): an OTLP
    export line holds several records, the ordinal tells them apart."""
    overrides = dict(cfg.fields)
    shape = _file_shape(cfg)
    roots: dict[Any, Any] = {}
    last, sub = -1, 0
    for line, obj in read_source(src):
        sub = sub + 1 if line == last else 0
        last = line
        if isinstance(obj, RawError) or not isinstance(obj, dict):
            continue
        try:
            if shape is None:
                shape = detect(obj)
            if shape in HASHED_SHAPES:
                return
            rec = normalise(obj, shape, src.path, line, overrides, roots)
        except RecordError:
            continue
        if rec.kind != "hashed":
            yield sub, rec
