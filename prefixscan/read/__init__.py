"""Reading logs: sources, file formats, record shapes, fields and timestamps -> normalised records and rejects.

Log shapes of the wider ecosystem are converted to the chat shape before normalisation, one module per
ecosystem, each with its converter (`*_to_chat`) and that converter inverted for `fix` (`*_map`, on the
slots of `read/promptmap.py`):
- `read/otel.py`: OpenTelemetry GenAI spans;
- `read/anthropic.py`: Anthropic Messages API logs;
- `read/responses.py`: OpenAI Responses API logs.

Each converter returns a plain chat record (`messages`, `tools`, `model`, `timestamp`, `request_id`,
`conversation_id`, `output_tokens`, `actual_cached_tokens`, `reported_prompt_tokens`), so the rest of the
pipeline knows one shape; a record that lacks what its conversion needs raises `read/record.py`'s
RecordError (a reject). What they share (`json_value`, `parts_text`) is in `read/content.py`.
"""
