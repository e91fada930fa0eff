"""Slow, obviously correct references the tests compare the product against. They never run in the product
(the layer test keeps `prefixscan` from importing `tests`), so they may be as plain and slow as they like."""
