"""Running the analysis past one machine: the encode stage on Ray, the reuse join as SQL (docs/scale.md)."""
