"""Serving-time model of one replica: prefill time from new and cached tokens, decode time per token.

Prefill milliseconds = a + b*new + c*cached + d*new*cached + e*new^2, a form that covers both sources:
- "cost": FLOPs from prefixscan.cost (2*N*L + 4*layers*d_model*(L*c + L^2/2), docs/engines.md, 'Prefill cost') at a
  model-FLOPs utilisation on the chosen GPU, so b = 2N/F, d = 4*layers*d_model/F, e = d/2, a = c = 0;
- "preble": the fit measured by Preble (ICLR 2025) for Llama-3-70B on H100 (docs/engines.md, 'Preble E2'),
  ms = 28.93 + 0.182*new + 0.004*context + 2.55e-6*new*context with context = cached + new;
- "coeffs": the user's own (a, b, c, d, e) from profiling their engine;
- "profile": a named hardware profile (JSON; `load_profile`), e.g. the fit `conformance.calibrate` makes
  against a real vLLM engine (prefixscan/sim/profiles/).
Decode: each output token after the first costs tpot * (1 + slowdown * (running decodes - 1)), a linear
batching slowdown. Chunked prefill shares a per-step token budget with decodes (one token each), so a
prefill on a replica with D running decodes proceeds at (budget - D) / budget of its solo speed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prefixscan.errors import UsageError
from prefixscan.hardware import flops, gpus, models
from prefixscan.sim.kvcache import decode_steps


def prefill_ms(a: float, b: float, c: float, d: float, e: float, new: Any, cached: Any) -> Any:
    """Prefill milliseconds of `new` uncached and `cached` tokens: a + b*new + c*cached + d*new*cached +
    e*new^2, the one statement of the formula. Plain arithmetic, so the same function (and the same
    rounding) serves a scalar, numpy arrays and, compiled in `fast/shared.py`, the kernels; a = 0 gives
    one prefill's token terms, which a batched step adds to its fixed term."""
    return a + b * new + c * cached + d * new * cached + e * new * new


def step_share(token_budget: int, decoding: int) -> float:
    """Fraction of the step token budget a prefill gets beside `decoding` running decodes (one token each)."""
    return max(token_budget - decoding, 1) / token_budget


@dataclass(frozen=True)
class PrefillModel:
    """Coefficients in milliseconds; `source` says where they came from (kept in the manifest)."""

    a: float = 0.0
    b_new: float = 0.0
    c_cached: float = 0.0
    d_new_cached: float = 0.0
    e_new2: float = 0.0
    source: str = "coeffs"

    @property
    def coeffs(self) -> tuple[float, float, float, float, float]:
        """(a, b, c, d, e): the arguments `prefill_ms` takes before the token counts."""
        return self.a, self.b_new, self.c_cached, self.d_new_cached, self.e_new2

    def seconds(self, new: float, cached: float) -> float:
        if new <= 0:
            return 0.0
        return max(prefill_ms(*self.coeffs, float(new), float(cached)), 0.0) / 1000.0

    def batch_seconds(self, new: list[int], cached: list[int]) -> float:
        """Several prefills in one step (vLLM batches them): a once, plus each one's token terms."""
        ms, any_new = self.a, False
        for n, c in zip(new, cached, strict=True):
            if n > 0:
                ms += prefill_ms(0.0, *self.coeffs[1:], float(n), float(c))
                any_new = True
        return max(ms, 0.0) / 1000.0 if any_new else 0.0

    def seconds_vec(self, new: np.ndarray, cached: np.ndarray) -> np.ndarray:
        new = np.asarray(new, dtype=np.float64)
        ms = prefill_ms(*self.coeffs, new, np.asarray(cached, dtype=np.float64))
        return np.where(new > 0, np.maximum(ms, 0.0) / 1000.0, 0.0)


def preble_fit() -> PrefillModel:
    """Preble's measured Llama-3-70B / H100 prefill time, expanded to (new, cached) terms."""
    a, b, c, d = 28.93, 0.182, 0.004, 2.55e-6
    # c*(cached+new) + d*new*(cached+new) = c*cached + c*new + d*new*cached + d*new^2
    return PrefillModel(a=a, b_new=b + c, c_cached=c, d_new_cached=d, e_new2=d, source="preble-llama3-70b-h100")


def from_coeffs(coeffs: tuple[float, ...]) -> PrefillModel:
    """User coefficients (a, b, c, d, e) in ms; missing trailing terms are 0."""
    vals = list(coeffs) + [0.0] * (5 - len(coeffs))
    return PrefillModel(*[float(v) for v in vals[:5]], source="user-coeffs")  # type: ignore[misc,arg-type]  # 5 floats


def from_cost_model(model: str, gpu: str, dtype: str, mfu: float = 0.5, tensor_parallel: int = 1) -> PrefillModel:
    """Compute-bound prefill coefficients for `model` on `tensor_parallel` x `gpu` at `mfu`."""
    spec, g = models.get_model(model), gpus.get_gpu(gpu)
    f = flops.effective_flops(g, dtype, mfu) * tensor_parallel
    attn = 4.0 * spec.layers * spec.hidden_size / f * 1000.0
    return PrefillModel(
        a=0.0,
        b_new=2.0 * spec.active_params / f * 1000.0,
        c_cached=0.0,
        d_new_cached=attn,
        e_new2=attn / 2.0,
        source=f"cost:{spec.name}/{g.name}/{dtype}/tp{tensor_parallel}/mfu{mfu}",
    )


def kv_capacity_blocks(model: str, gpu: str, dtype: str, block_size: int, tensor_parallel: int = 1,
                       gpu_memory_utilization: float = 0.9) -> int:
    """KV blocks one replica holds after weights (prefixscan.hardware.flops.kv_capacity_tokens / block)."""
    spec, g = models.get_model(model), gpus.get_gpu(gpu)
    tokens = flops.kv_capacity_tokens(spec, g, flops.dtype_bytes(dtype), tensor_parallel, gpu_memory_utilization)
    if tokens <= 0:
        raise UsageError(
            f"{spec.name} weights do not fit on {tensor_parallel} x {g.name} in {dtype}; raise "
            "--tensor-parallel or pass --kv-blocks"
        )
    return max(1, tokens // block_size)


@dataclass(frozen=True)
class ServingModel:
    """Prefill and decode durations on one replica given its current batch."""

    prefill: PrefillModel
    tpot_s: float = 0.02
    decode_slowdown: float = 0.004
    token_budget: int = 8192

    def prefill_s(self, new: float, cached: float, decoding: int) -> float:
        return self.prefill.seconds(new, cached) / step_share(self.token_budget, decoding)

    def prefill_batch_s(self, new: list[int], cached: list[int], decoding: int) -> float:
        """One engine step running several prefills: the fixed term once, the per-token terms summed."""
        return self.prefill.batch_seconds(new, cached) / step_share(self.token_budget, decoding)

    def prefill_s_vec(self, new: np.ndarray, cached: np.ndarray, decoding: np.ndarray) -> np.ndarray:
        share = np.maximum(self.token_budget - decoding, 1) / self.token_budget
        return self.prefill.seconds_vec(new, cached) / share

    def tpot(self, decoding: int) -> float:
        return self.tpot_s * (1.0 + self.decode_slowdown * max(decoding - 1, 0))

    def decode_s(self, output_tokens: int, decoding: int) -> float:
        """Time from first token to last for a request joining a batch of `decoding` sequences."""
        return decode_steps(output_tokens) * self.tpot(decoding)


def load_s(tokens: float, bytes_per_token: float, gbs: float, latency_s: float = 0.0) -> float:
    """Seconds to move `tokens` of KV over a link of `gbs` GB/s with a per-request latency (0 tokens: 0 s).

    The load-time term for blocks taken from a slower KV tier (host memory, a shared store): it is added
    to the request's prefill, so it enters TTFT.
    """
    if tokens <= 0:
        return 0.0
    return latency_s + tokens * bytes_per_token / (gbs * 1e9)


def transfer_s(tokens: float, bytes_per_token: float, gbs: float, latency_s: float) -> float:
    """Prefill-to-decode KV transfer (disaggregated serving): bytes / link bandwidth + latency, paid even
    for no tokens (unlike a tier load)."""
    return latency_s + load_s(tokens, bytes_per_token, gbs)


def kv_bytes_per_token(model: str, dtype: str, tensor_parallel: int = 1) -> float:
    """KV bytes per token one GPU of a replica holds and moves (the model's KV split over TP ranks)."""
    return models.get_model(model).kv_bytes_per_token(flops.dtype_bytes(dtype)) / max(tensor_parallel, 1)


PROFILE_FORMAT = "prefixscan-timing-profile/1"
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
PREFILL_KEYS = ("a", "b_new", "c_cached", "d_new_cached", "e_new2")


@dataclass(frozen=True)
class TimingProfile:
    """A named hardware profile: prefill coefficients (and decode time) fitted to one engine.

    `hardware` names what was measured (conformance.calibrate writes the CPU's model name and says it is
    not a GPU); `fit` keeps how the coefficients were obtained (requests, residuals, load average)."""

    name: str
    hardware: str
    prefill: PrefillModel
    tpot_s: float | None = None
    decode_slowdown: float | None = None
    fit: dict | None = None

    def to_dict(self) -> dict:
        """The JSON form `load_profile` reads back."""
        return {
            "format": PROFILE_FORMAT,
            "name": self.name,
            "hardware": self.hardware,
            "prefill_ms": dict(zip(PREFILL_KEYS, self.prefill.coeffs, strict=True)),
            "tpot_s": self.tpot_s,
            "decode_slowdown": self.decode_slowdown,
            "fit": self.fit or {},
        }


def profile_names() -> list[str]:
    """Built-in profiles (prefixscan/sim/profiles/*.json), loadable by name."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> TimingProfile:
    """A profile from a JSON file, or a built-in one by name; a clear UsageError for anything else."""
    path = Path(name_or_path)
    if not path.is_file():
        path = PROFILE_DIR / f"{name_or_path}.json"
        if not path.is_file():
            known = ", ".join(profile_names()) or "none"
            raise UsageError(f"--timing-profile {name_or_path!r}: no such file or built-in profile (built-in: {known})")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("format") != PROFILE_FORMAT:
            raise ValueError(f"format is {doc.get('format')!r}, expected {PROFILE_FORMAT!r}")
        pm = doc["prefill_ms"]
        vals = [float(pm.get(k, 0.0)) for k in PREFILL_KEYS]
        if not all(math.isfinite(v) for v in vals):
            raise ValueError("prefill_ms holds a non-finite number")
        tpot, slow = doc.get("tpot_s"), doc.get("decode_slowdown")
        name = str(doc.get("name") or path.stem)
        return TimingProfile(
            name=name,
            hardware=str(doc.get("hardware") or "unknown"),
            prefill=PrefillModel(*vals, source=f"profile:{name}"),  # type: ignore[misc,arg-type]  # 5 floats
            tpot_s=None if tpot is None else float(tpot),
            decode_slowdown=None if slow is None else float(slow),
            fit=doc.get("fit") or {},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--timing-profile {path}: not a timing profile ({exc})") from None


def profile_options(name_or_path: str) -> dict:
    """SimConfig fields for a profile: its prefill coefficients, name and (when it has them) decode times."""
    prof = load_profile(name_or_path)
    out: dict = {"prefill_model": "profile", "timing_profile": prof.name, "prefill_coeffs": prof.prefill.coeffs}
    if prof.tpot_s is not None:
        out["tpot_s"] = prof.tpot_s
    if prof.decode_slowdown is not None:
        out["decode_slowdown"] = prof.decode_slowdown
    return out
