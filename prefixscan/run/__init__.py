"""The run directory: its files, manifest, lock, atomic writes and named simulations (docs/run-directory.md)."""
