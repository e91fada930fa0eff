"""Prefill FLOPs, prefill time and KV capacity: the arithmetic that turns tokens into GPUs.

Forward FLOPs per token ~ 2 x active parameters (Kaplan et al. 2020, arXiv 2001.08361) plus attention
over the context it sees, 4 x layers x d_model per context token; a prefill of L new tokens after c
cached ones therefore costs 2*N*L + 4*layers*d_model*(L*c + L^2/2) (docs/engines.md, 'Prefill cost').
"""

from __future__ import annotations

import math

from prefixscan.errors import UsageError
from prefixscan.hardware.gpus import GpuSpec
from prefixscan.hardware.models import ModelSpec

DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5, "mxfp4": 0.53125}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element for a dtype name (mxfp4: 4 bits + one 8-bit scale per 32 values)."""
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise UsageError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}") from None


def prefill_flops(new_tokens: float, cached_tokens: float, model: ModelSpec, linear: bool = False) -> float:
    """FLOPs to prefill `new_tokens` after `cached_tokens` already in the KV cache.

    `linear` drops the attention term, which is how the seed's worked example counts (2 x params/token).
    """
    n, c = float(new_tokens), float(cached_tokens)
    if n < 0 or c < 0:
        raise UsageError(f"token counts must be >= 0 (new={new_tokens}, cached={cached_tokens})")
    dense = 2.0 * model.active_params * n
    if linear:
        return dense
    return dense + 4.0 * model.layers * model.hidden_size * (n * c + n * n / 2.0)


def effective_flops(gpu: GpuSpec, dtype: str, mfu: float = 0.5) -> float:
    """FLOP/s one GPU sustains in prefill: peak dense FLOP/s for the dtype x model FLOPs utilisation."""
    if not 0 < mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], got {mfu}")
    return gpu.flops(dtype) * mfu


def prefill_seconds(new_tokens: float, cached_tokens: float, model: ModelSpec, gpu: GpuSpec, dtype: str,
                    mfu: float = 0.5, linear: bool = False, gpus: float = 1.0) -> float:
    """Compute time of one prefill on `gpus` GPUs' worth of throughput (compute-bound, no queueing)."""
    if gpus <= 0:
        raise UsageError(f"GPU count for a prefill must be > 0, got {gpus}")
    return prefill_flops(new_tokens, cached_tokens, model, linear) / (effective_flops(gpu, dtype, mfu) * gpus)


def decode_gpu_seconds_per_token(model: ModelSpec, gpu: GpuSpec, dtype: str, context_tokens: float,
                                 kv_dtype_bytes: float, batch: int = 64, mfu: float = 0.5) -> float:
    """GPU-seconds one output token costs in a decode batch (roofline: memory or compute bound).

    A decode step reads all resident weights once for the whole batch plus each sequence's KV cache,
    so per token it moves weights/batch + context x KV bytes; it is rarely compute-bound.
    """
    if batch <= 0:
        raise UsageError(f"--decode-batch must be > 0, got {batch}")
    moved = model.weight_bytes(dtype_bytes(dtype)) / batch + context_tokens * model.kv_bytes_per_token(
        kv_dtype_bytes)
    memory_s = moved / gpu.bandwidth_bytes_s
    compute_s = 2.0 * model.active_params / effective_flops(gpu, dtype, mfu)
    return max(memory_s, compute_s)


def kv_capacity_tokens(model: ModelSpec, gpu: GpuSpec, dtype_bytes: float, tensor_parallel: int = 1,
                       gpu_memory_utilization: float = 0.9, weight_dtype_bytes: float | None = None) -> int:
    """Tokens of KV cache one replica holds: usable memory after weights, over KV bytes per token.

    Mirrors vLLM's `gpu_memory_utilization` (default 0.9); activations and CUDA graphs are ignored,
    so this is an upper bound. Returns 0 when the weights do not fit.
    """
    if tensor_parallel < 1:
        raise UsageError(f"--tensor-parallel must be >= 1, got {tensor_parallel}")
    if not 0 < gpu_memory_utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")
    wbytes = model.weight_bytes(dtype_bytes if weight_dtype_bytes is None else weight_dtype_bytes)
    free = tensor_parallel * gpu.memory_bytes * gpu_memory_utilization - wbytes
    per_token = model.kv_bytes_per_token(dtype_bytes)
    if free <= 0 or per_token <= 0:
        return 0
    return int(free // per_token)


def default_tensor_parallel(model: ModelSpec, gpu: GpuSpec, weight_dtype_bytes: float,
                            gpu_memory_utilization: float = 0.9) -> int:
    """Smallest power-of-two TP degree whose weights use at most 3/4 of usable memory (1/4 left for KV)."""
    usable = gpu.memory_bytes * gpu_memory_utilization
    need = model.weight_bytes(weight_dtype_bytes) / (0.75 * usable)
    return max(1, 2 ** math.ceil(math.log2(need))) if need > 1 else 1
