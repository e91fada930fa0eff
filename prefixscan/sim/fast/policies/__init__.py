"""What the compiled policies share: `base` (the arrays a kernel reads, `PolicyArrays`), `common` (compiled
helpers) and `dispatch` (one entry point by policy code). Each policy's kernel lives beside its readable
reference, in `prefixscan/sim/policies/<name>.py`."""
