"""The one seam between the distributed engine and the local pipeline's stages.

Everything `prefixscan.distributed` uses from the read and encode stages and the requests frame is
imported here and nowhere else in this package (from `prefixscan.pipeline`), so moving those stages is a
change to this file alone. The driver-side names (`ingest`, `Batch`, `Ingested`) load on first use: an
encode actor imports only the readers and the encoder (0.5 s), not the pipeline with polars and numba (2 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.encoder import Hashed, RecordEncoder, Rejected, pin_hash
from prefixscan.encode.vllm_hash import has_lora_path
from prefixscan.read.readers import RawError, read_source
from prefixscan.read.shapes import Record, RecordError, detect, normalise
from prefixscan.read.sources import Source

if TYPE_CHECKING:
    from prefixscan.pipeline.encode import Batch, Ingested, ingest  # noqa: F401 - loaded by __getattr__

__all__ = ["AnalyzeConfig", "Hashed", "Record", "RecordEncoder", "Rejected", "Source", "has_lora_path", "pin_hash",
           "text_records"]  # and, on first use, Batch, Ingested, ingest


def __getattr__(name: str) -> Any:
    """`ingest`, `Batch`, `Ingested` from the pipeline's encode stage, imported when first asked for."""
    if name in ("ingest", "Batch", "Ingested"):
        from prefixscan.pipeline import encode

        return getattr(encode, name)
    raise AttributeError(name)


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
