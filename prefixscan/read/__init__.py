"""Reading logs: sources, file formats, record shapes, fields and timestamps -> normalised records and rejects.

Ecosystem shapes are converted to the chat shape before normalisation, one module each with its converter
(`*_to_chat`) and that converter inverted for `fix` (`*_map`, on the slots of `read/promptmap.py`):
`read/otel.py` (OpenTelemetry GenAI spans), `read/anthropic.py` (Anthropic Messages), `read/responses.py`
(OpenAI Responses). Each returns a plain chat record, so the rest of the pipeline knows one shape; a record
that lacks what its conversion needs raises RecordError (a reject). They share `read/content.py`.
"""
