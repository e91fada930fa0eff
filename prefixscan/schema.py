"""Arrow schemas of the tables that cross stage boundaries.

The requests table is the seam between ingest and every analysis: hashed traces enter here directly,
`simulate` and `estimate` read it, and `docs/tables.md` documents each column (a test keeps them in sync).
"""

from __future__ import annotations

import pyarrow as pa

TYPES = {"int32": pa.int32(), "int64": pa.int64(), "uint64": pa.uint64(), "float64": pa.float64(),
         "string": pa.string(), "bool": pa.bool_(), "list<uint64>": pa.list_(pa.uint64())}


def fields(spec: str) -> list[pa.Field]:
    """Columns written as `name:type` words (types: `TYPES`), in order; `!` after the type: never null."""
    out = []
    for word in spec.split():
        name, kind = word.split(":")
        out.append(pa.field(name, TYPES[kind.rstrip("!")], nullable=not kind.endswith("!")))
    return out


# Columns produced by ingest + tokenise + hash (one row per accepted request, analysis order). The log's own
# latency (ttft_s, e2e_s, queue_wait_s) is in seconds (read/latency.py), null where the log has none.
REQUEST_INPUT_FIELDS = fields(
    "seq:int64! request_id:string! source_file:string! source_line:int64! timestamp_s:float64! arrival_s:float64! "
    "tenant:string conversation_id:string conversation_inferred:bool! user:string model:string adapter:string "
    "cache_salt:string replica:string category:string turn_index:int32 prompt_tokens:int64! head_tokens:int64 "
    "output_tokens:int64 actual_cached_tokens:int64 ttft_s:float64 e2e_s:float64 queue_wait_s:float64 "
    "namespace:uint64! block_hashes:list<uint64>!")

# Columns added by the ideal-cache reuse analysis.
REQUEST_REUSE_FIELDS = fields(
    "cached_tokens:int64! cached_blocks:int32! divergence_token:int64! conversation_cached_tokens:int64! "
    "tenant_cached_tokens:int64! source_request_id:string hit_source:string! prefix_class:string! "
    "predicted_minus_actual:int64")

REQUESTS_SCHEMA = pa.schema(REQUEST_INPUT_FIELDS + REQUEST_REUSE_FIELDS)

REJECTS_SCHEMA = pa.schema(fields("source_file:string! source_line:int64! reason:string! detail:string"))


# The requests-table columns a replay (simulate, estimate) cannot do without.
REPLAY_COLUMNS = ("seq", "request_id", "arrival_s", "prompt_tokens", "block_hashes")
