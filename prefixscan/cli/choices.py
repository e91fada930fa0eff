"""The fixed sets `--help` shows as choices (`<a|b|c>` instead of `<str>`). They are spelled out here so
`prefixscan --help` imports no heavy module; tests/test_cli_polish.py checks each equals the library's own
list. Values stay plain strings checked by the library, so a wrong one is a one-line error."""

from __future__ import annotations

RECORD_FORMATS = ("auto", "chat", "openai-batch", "gateway", "completion", "tokens", "mooncake", "bailian", "otel",
                  "anthropic", "responses")
ORDERS = ("time", "input")
GRANULARITIES = ("block", "token")
EVICTIONS = ("vllm", "radix")
PREFILL_MODELS = ("cost", "preble", "coeffs", "profile")
KNOWLEDGE = ("exact", "delayed", "approximate")
REPORT_FORMATS = ("md", "html", "both")
SYNTH_FORMATS = ("jsonl", "jsonl.gz", "parquet", "mooncake")
QUERY_FORMATS = ("table", "csv", "json", "parquet")

POLICIES = ("round_robin", "random", "least_loaded", "session_affinity", "chwbl", "prefix_hash",
            "sglang_cache_aware", "dynamo_kv", "llmd_weighted", "preble_e2", "cost_based", "oracle")
FIELDS = ("request_id", "timestamp", "tenant", "conversation_id", "user", "model", "adapter", "cache_salt", "replica",
          "category", "turn_index", "output_tokens", "actual_cached_tokens", "reported_prompt_tokens", "messages",
          "tools", "prompt", "ttft_s", "ttft_ms", "e2e_s", "e2e_ms", "queue_wait_s", "queue_wait_ms")
DTYPES = ("bf16", "fp16", "fp8", "int8", "fp4", "mxfp4")


def model_names() -> str:
    """The catalogue's models, for help text (the catalogue is a small pure-Python module)."""
    from prefixscan.hardware.models import list_models

    return ", ".join(m.name for m in list_models())


def gpu_names() -> str:
    from prefixscan.hardware.gpus import list_gpus

    return ", ".join(g.name for g in list_gpus())


def one_of(values: tuple[str, ...]) -> str:
    """The metavar of an option taking one of `values`."""
    return "<" + "|".join(values) + ">"
