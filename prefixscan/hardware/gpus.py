"""GPU catalogue: dense (not 2:4 sparsity) tensor FLOP/s, memory, bandwidth and an illustrative price.

Vendors headline sparse FLOP/s; prefill runs dense matmuls, so every number here is the dense one
(half the sparse figure). Prices are illustrative on-demand cloud rates for comparison only; pass
--usd-per-gpu-hour with your contract price.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixscan.errors import UsageError

_T = 1e12
_GB = 1e9


@dataclass(frozen=True)
class GpuSpec:
    """Peak dense FLOP/s per dtype, HBM bytes, HBM bandwidth and a price per GPU-hour."""

    name: str
    bf16_flops: float
    fp8_flops: float
    memory_bytes: float
    bandwidth_bytes_s: float
    usd_per_hour: float
    source: str = ""

    def flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for a compute dtype ("bf16"/"fp16" or "fp8")."""
        d = dtype.lower()
        if d in ("bf16", "fp16", "float16", "bfloat16"):
            return self.bf16_flops
        if d in ("fp8", "int8", "e4m3", "fp4", "mxfp4"):
            return self.fp8_flops
        raise UsageError(f"unknown dtype {dtype!r}; use bf16 or fp8")


_CATALOGUE: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        # NVIDIA H100 SXM5 datasheet: 989 TFLOP/s BF16, 1,979 TFLOP/s FP8 (dense), 80 GB HBM3, 3.35 TB/s.
        GpuSpec("h100-sxm", 989.4 * _T, 1978.9 * _T, 80 * _GB, 3.35e12, 2.50, "NVIDIA H100 datasheet"),
        # H100 PCIe: 756 TFLOP/s BF16, 1,513 FP8 dense, 80 GB HBM2e, 2.0 TB/s (same datasheet).
        GpuSpec("h100-pcie", 756 * _T, 1513 * _T, 80 * _GB, 2.0e12, 2.00, "NVIDIA H100 datasheet"),
        # H200 SXM: H100 compute, 141 GB HBM3e, 4.8 TB/s (NVIDIA H200 datasheet).
        GpuSpec("h200", 989.4 * _T, 1978.9 * _T, 141 * _GB, 4.8e12, 3.50, "NVIDIA H200 datasheet"),
        # B200 (HGX B200): 2.25 PFLOP/s BF16, 4.5 PFLOP/s FP8 dense; 180 GB HBM3e usable per GPU
        # (1,440 GB per 8-GPU HGX), 8 TB/s (NVIDIA HGX B200 / DGX B200 datasheets).
        GpuSpec("b200", 2250 * _T, 4500 * _T, 180 * _GB, 8.0e12, 5.00, "NVIDIA HGX B200 datasheet"),
        # A100 SXM 80GB: 312 TFLOP/s BF16 dense, no FP8 tensor cores (FP8 runs at BF16 rate via
        # weight-only kernels), 80 GB HBM2e, 2.039 TB/s (NVIDIA A100 datasheet).
        GpuSpec("a100-80gb", 312 * _T, 312 * _T, 80 * _GB, 2.039e12, 1.50, "NVIDIA A100 datasheet"),
        # L40S: 362 TFLOP/s BF16 and 1,466 FP8 *with sparsity* -> 181 and 733 dense; 48 GB GDDR6,
        # 864 GB/s (NVIDIA L40S datasheet).
        GpuSpec("l40s", 181 * _T, 733 * _T, 48 * _GB, 0.864e12, 1.00, "NVIDIA L40S datasheet"),
        # AMD Instinct MI300X: 1,307 TFLOP/s BF16, 2,615 FP8 dense, 192 GB HBM3, 5.3 TB/s (AMD datasheet).
        GpuSpec("mi300x", 1307.4 * _T, 2614.9 * _T, 192 * _GB, 5.3e12, 2.50, "AMD MI300X datasheet"),
    ]
}

_ALIASES = {
    "h100": "h100-sxm", "h100sxm": "h100-sxm", "h100-sxm5": "h100-sxm", "h200-sxm": "h200",
    "a100": "a100-80gb", "a100-80g": "a100-80gb", "a100-sxm": "a100-80gb", "b200-sxm": "b200",
    "mi300": "mi300x",
}


def list_gpus() -> list[GpuSpec]:
    """All catalogue GPUs, in catalogue order."""
    return list(_CATALOGUE.values())


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by name or alias (case-insensitive): h100, h100-sxm, h200, b200, a100, l40s, mi300x."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    spec = _CATALOGUE.get(key)
    if spec is None:
        raise UsageError(f"unknown GPU {name!r}; known GPUs: {', '.join(_CATALOGUE)} "
                         "(or pass --gpu-flops and --usd-per-gpu-hour)")
    return spec
