"""The pilot's outcome from its own logs: latency by class, the router's decisions, prediction vs outcome."""
