"""The analyze pipeline, one module per stage in data-flow order (docs/pipeline.md):

read -> encode (encoder, encode_pool, encode_workers, encode_wire) -> reuse (frame) -> aggregate -> detect -> summary
-> write, orchestrated by `run` (`run.analyze`, `run.run_analysis`), with `config` for the option checks
and batch sizes. Every log goes the same way, streamed in chunks or taken as one chunk.
"""
