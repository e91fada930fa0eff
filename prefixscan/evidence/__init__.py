"""Evidence from the engine itself, joined with a run: Prometheus counters and vLLM KV events.

The log says what prefixscan predicts; the engine's counters and KV events say what it served and
stored. Putting them side by side is how a prediction is checked before money is decided.
"""
