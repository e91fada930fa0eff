"""The detector as it was before issue 15's fast path (main at 973c53d): a slow, obviously-correct reference.

`tests/test_detect_fast.py` feeds it and the fast `prefixscan.detect.Detector` the same records and checks
that their whole state (families, accumulators, operation sets, queued rewrites) and their findings are
equal; `bench/studies/detector_speed.py` times both in one run. Only `detector.py`, `pattern_free.py` and
`dynamic_fields.py` are frozen copies; the pure helpers they call (normalisation, patterns, rewrite, accumulate)
are shared.
"""
