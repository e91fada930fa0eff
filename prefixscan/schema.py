"""Arrow schemas of the tables that cross stage boundaries.

The requests table is the seam between ingest and every analysis: hashed traces enter here directly,
`simulate` and `estimate` read it, and `docs/tables.md` documents each column (a test keeps them in sync).
"""

from __future__ import annotations

import pyarrow as pa

# Columns produced by ingest + tokenise + hash (one row per accepted request, analysis order).
REQUEST_INPUT_FIELDS: list[pa.Field] = [
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("request_id", pa.string(), nullable=False),
    pa.field("source_file", pa.string(), nullable=False),
    pa.field("source_line", pa.int64(), nullable=False),
    pa.field("timestamp_s", pa.float64(), nullable=False),
    pa.field("arrival_s", pa.float64(), nullable=False),
    pa.field("tenant", pa.string()),
    pa.field("conversation_id", pa.string()),
    pa.field("conversation_inferred", pa.bool_(), nullable=False),
    pa.field("user", pa.string()),
    pa.field("model", pa.string()),
    pa.field("adapter", pa.string()),
    pa.field("cache_salt", pa.string()),
    pa.field("replica", pa.string()),
    pa.field("category", pa.string()),
    pa.field("turn_index", pa.int32()),
    pa.field("prompt_tokens", pa.int64(), nullable=False),
    pa.field("head_tokens", pa.int64()),
    pa.field("output_tokens", pa.int64()),
    pa.field("actual_cached_tokens", pa.int64()),
    # The log's own latency, seconds (read/latency.py): null where the log has none.
    pa.field("ttft_s", pa.float64()),
    pa.field("e2e_s", pa.float64()),
    pa.field("queue_wait_s", pa.float64()),
    pa.field("namespace", pa.uint64(), nullable=False),
    pa.field("block_hashes", pa.list_(pa.uint64()), nullable=False),
]

# Columns added by the ideal-cache reuse analysis.
REQUEST_REUSE_FIELDS: list[pa.Field] = [
    pa.field("cached_tokens", pa.int64(), nullable=False),
    pa.field("cached_blocks", pa.int32(), nullable=False),
    pa.field("divergence_token", pa.int64(), nullable=False),
    pa.field("conversation_cached_tokens", pa.int64(), nullable=False),
    pa.field("tenant_cached_tokens", pa.int64(), nullable=False),
    pa.field("source_request_id", pa.string()),
    pa.field("hit_source", pa.string(), nullable=False),
    pa.field("prefix_class", pa.string(), nullable=False),
    pa.field("predicted_minus_actual", pa.int64()),
]

REQUESTS_SCHEMA = pa.schema(REQUEST_INPUT_FIELDS + REQUEST_REUSE_FIELDS)

REJECTS_SCHEMA = pa.schema(
    [
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string()),
    ]
)


# The requests-table columns a replay (simulate, estimate) cannot do without.
REPLAY_COLUMNS = ("seq", "request_id", "arrival_s", "prompt_tokens", "block_hashes")
