"""The detector as it was before issue 15's fast path (main at 973c53d): a slow, obviously-correct reference.

`tests/test_detect_fast.py` feeds it and the fast `prefixscan.detect.Detector` the same records and checks
that their whole state (families, accumulators, operation sets, queued rewrites) and their findings are
equal; `bench/detector_speed.py` times both in one run. Only `detector.py` and `pattern_free.py` are frozen
copies; the pure helpers they call (normalisation, dynamic_fields, rewrite, accumulate) are shared.
"""
