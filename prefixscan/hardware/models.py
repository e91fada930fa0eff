"""Model catalogue: the few architecture numbers the cost model needs, from published config.json files.

Prefill FLOPs need active parameters, layers and d_model; KV capacity needs the bytes one cached token
costs. Every value below is from the model's Hugging Face `config.json` (layers, hidden size, KV heads,
head dim, MLA ranks) and its model card or paper (parameter counts). Any of them can be overridden from
the command line, and `load_hf_config` reads a local config.json for models not listed here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from prefixscan.errors import InputError, UsageError


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts for one model. Parameter counts are absolute (70.6e9, not 70.6)."""

    name: str
    total_params: float
    active_params: float
    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    kv_layout: str = "gqa"  # "gqa" (includes MHA/MQA) or "mla" (DeepSeek multi-head latent attention)
    kv_lora_rank: int = 0  # MLA: width of the compressed KV latent that is cached
    qk_rope_head_dim: int = 0  # MLA: decoupled RoPE key, cached next to the latent
    sliding_window_layers: int = 0  # layers whose KV is capped at `sliding_window` tokens
    sliding_window: int = 0
    source: str = ""

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """Bytes of KV cache one prompt token occupies (what a prefix hit keeps resident).

        GQA: K and V per layer per KV head (docs/engines.md, 'Prefill cost'). MLA caches one latent of
        kv_lora_rank + qk_rope_head_dim per layer (DeepSeek-V2 paper, section 2.1). Sliding-window layers
        hold at most `sliding_window` tokens, so for long prefixes only full-attention layers count.
        """
        full_layers = self.layers - self.sliding_window_layers
        if self.kv_layout == "mla":
            return float((self.kv_lora_rank + self.qk_rope_head_dim) * full_layers * dtype_bytes)
        return float(2 * full_layers * self.kv_heads * self.head_dim * dtype_bytes)

    def weight_bytes(self, dtype_bytes: float) -> float:
        """Bytes of weights resident on a replica (all experts of an MoE model are resident)."""
        return float(self.total_params * dtype_bytes)

    @property
    def is_moe(self) -> bool:
        return self.active_params < self.total_params


_B = 1e9

# name -> spec. Architecture numbers: config.json of the Hugging Face repo named in `source`.
_CATALOGUE: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # meta-llama/Llama-3.1-8B: 32 layers, hidden 4096, 8 KV heads, head_dim 128; 8.03B params.
        ModelSpec("llama-3.1-8b", 8.03 * _B, 8.03 * _B, 32, 4096, 8, 128, source="meta-llama/Llama-3.1-8B"),
        # meta-llama/Llama-3.1-70B: 80 layers, hidden 8192, 8 KV heads, head_dim 128; 70.6B params.
        ModelSpec("llama-3.1-70b", 70.6 * _B, 70.6 * _B, 80, 8192, 8, 128, source="meta-llama/Llama-3.1-70B"),
        # meta-llama/Llama-3.1-405B: 126 layers, hidden 16384, 8 KV heads, head_dim 128; 405.9B params.
        ModelSpec("llama-3.1-405b", 405.9 * _B, 405.9 * _B, 126, 16384, 8, 128,
                  source="meta-llama/Llama-3.1-405B"),
        # Qwen/Qwen2.5-7B: 28 layers, hidden 3584, 4 KV heads (28 query heads, head_dim 128); 7.61B params.
        ModelSpec("qwen2.5-7b", 7.61 * _B, 7.61 * _B, 28, 3584, 4, 128, source="Qwen/Qwen2.5-7B"),
        # Qwen/Qwen2.5-72B: 80 layers, hidden 8192, 8 KV heads, head_dim 128; 72.7B params.
        ModelSpec("qwen2.5-72b", 72.7 * _B, 72.7 * _B, 80, 8192, 8, 128, source="Qwen/Qwen2.5-72B"),
        # Qwen/Qwen3-32B: 64 layers, hidden 5120, 8 KV heads, head_dim 128 (64 query heads); 32.8B params.
        ModelSpec("qwen3-32b", 32.8 * _B, 32.8 * _B, 64, 5120, 8, 128, source="Qwen/Qwen3-32B"),
        # Qwen/Qwen3-235B-A22B: 94 layers, hidden 4096, 4 KV heads, head_dim 128, 128 experts top-8;
        # 235B total, 22B active.
        ModelSpec("qwen3-235b-a22b", 235 * _B, 22 * _B, 94, 4096, 4, 128, source="Qwen/Qwen3-235B-A22B"),
        # mistralai/Mistral-7B-v0.3: 32 layers, hidden 4096, 8 KV heads, head_dim 128; 7.25B params.
        ModelSpec("mistral-7b", 7.25 * _B, 7.25 * _B, 32, 4096, 8, 128, source="mistralai/Mistral-7B-v0.3"),
        # mistralai/Mixtral-8x7B-v0.1: 32 layers, hidden 4096, 8 KV heads, 8 experts top-2;
        # 46.7B total, 12.9B active (Mixtral paper, arXiv 2401.04088).
        ModelSpec("mixtral-8x7b", 46.7 * _B, 12.9 * _B, 32, 4096, 8, 128,
                  source="mistralai/Mixtral-8x7B-v0.1"),
        # deepseek-ai/DeepSeek-V3: 61 layers, hidden 7168, MLA kv_lora_rank 512, qk_rope_head_dim 64;
        # 671B total, 37B active (DeepSeek-V3 technical report, arXiv 2412.19437). 128 heads x 128 nope dim.
        ModelSpec("deepseek-v3", 671 * _B, 37 * _B, 61, 7168, 128, 128, kv_layout="mla", kv_lora_rank=512,
                  qk_rope_head_dim=64, source="deepseek-ai/DeepSeek-V3"),
        # openai/gpt-oss-120b: 36 layers, hidden 2880, 8 KV heads, head_dim 64, layers alternate
        # sliding (window 128) and full attention; 116.8B total, 5.1B active (model card).
        ModelSpec("gpt-oss-120b", 116.8 * _B, 5.13 * _B, 36, 2880, 8, 64, sliding_window_layers=18,
                  sliding_window=128, source="openai/gpt-oss-120b"),
        # openai/gpt-oss-20b: 24 layers, same attention shape; 20.9B total, 3.6B active (model card).
        ModelSpec("gpt-oss-20b", 20.9 * _B, 3.61 * _B, 24, 2880, 8, 64, sliding_window_layers=12,
                  sliding_window=128, source="openai/gpt-oss-20b"),
    ]
}

_ALIASES: dict[str, str] = {
    "llama-3-8b": "llama-3.1-8b", "llama3.1-8b": "llama-3.1-8b", "meta-llama-3.1-8b": "llama-3.1-8b",
    "llama-3-70b": "llama-3.1-70b", "llama3.1-70b": "llama-3.1-70b", "meta-llama-3.1-70b": "llama-3.1-70b",
    "llama-3.3-70b": "llama-3.1-70b", "llama3.1-405b": "llama-3.1-405b",
    "qwen3-235b": "qwen3-235b-a22b", "mistral-7b-v0.3": "mistral-7b", "mistral-7b-v0.1": "mistral-7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b", "deepseek-v3-0324": "deepseek-v3", "deepseek-r1": "deepseek-v3",
}


def _key(name: str) -> str:
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = key.rsplit("/", 1)[-1]  # accept Hugging Face repo ids such as meta-llama/Llama-3.1-70B
    for suffix in ("-instruct", "-chat", "-fp8", "-bf16"):
        key = key.removesuffix(suffix)
    return _ALIASES.get(key, key)


def list_models() -> list[ModelSpec]:
    """All catalogue models, in catalogue order."""
    return list(_CATALOGUE.values())


def get_model(name: str) -> ModelSpec:
    """Look a model up by name, alias or Hugging Face repo id (case-insensitive)."""
    spec = _CATALOGUE.get(_key(name))
    if spec is None:
        raise UsageError(f"unknown model {name!r}; known models: {', '.join(_CATALOGUE)} (or pass --model-config "
                         "PATH to a config.json)")
    return spec


def override(spec: ModelSpec, params: float | None = None, active_params: float | None = None) -> ModelSpec:
    """A copy with the parameter counts replaced (dense models: active follows total)."""
    if params is not None:
        active = params if not spec.is_moe and active_params is None else spec.active_params
        spec = replace(spec, total_params=params, active_params=active)
    if active_params is not None:
        spec = replace(spec, active_params=active_params)
    return spec


def load_hf_config(path: str | os.PathLike[str]) -> ModelSpec:
    """Build a ModelSpec from a local Hugging Face `config.json` (file or model directory).

    Parameter counts are estimated from the shapes (embeddings, attention, dense or MoE MLP), which is
    within about 1% of published counts for Llama, Qwen, Mistral and Mixtral; pass --params to override.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise InputError(f"model config {p} not found; pass a config.json or a directory that holds one")
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read model config {p}: {exc}") from None
    cfg = cfg.get("text_config", cfg)  # multimodal configs nest the language model
    try:
        layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"model config {p} lacks {exc}; need num_hidden_layers, hidden_size, "
                         "num_attention_heads") from None
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    mla = cfg.get("kv_lora_rank") is not None
    layer_types = cfg.get("layer_types") or []
    sliding_layers = sum(1 for t in layer_types if "sliding" in str(t))
    total, active = _estimate_params(cfg, layers, hidden, heads, kv_heads, head_dim, mla)
    return ModelSpec(
        name=str(cfg.get("_name_or_path") or p.parent.name or "custom"),
        total_params=total, active_params=active, layers=layers, hidden_size=hidden, kv_heads=kv_heads,
        head_dim=head_dim, kv_layout="mla" if mla else "gqa",
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        sliding_window_layers=sliding_layers if sliding_layers < layers else 0,
        sliding_window=int(cfg.get("sliding_window") or 0) if sliding_layers else 0,
        source=str(p),
    )


def _estimate_params(cfg: dict, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                     mla: bool) -> tuple[float, float]:
    """Total and active parameter counts from config shapes (SwiGLU MLPs: 3 matrices)."""
    vocab = int(cfg.get("vocab_size") or 0)
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    if mla:
        nope, rope = int(cfg.get("qk_nope_head_dim", 128)), int(cfg.get("qk_rope_head_dim", 64))
        v_dim, kv_rank = int(cfg.get("v_head_dim", 128)), int(cfg["kv_lora_rank"])
        q_rank = cfg.get("q_lora_rank")
        q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        attn = q + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
        attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    inter = int(cfg.get("intermediate_size") or 4 * hidden)
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    if not experts:
        per_layer = attn + 3 * hidden * inter
        return float(embed + layers * per_layer), float(embed + layers * per_layer)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 1)
    expert_inter = int(cfg.get("moe_intermediate_size") or inter)
    shared = int(cfg.get("n_shared_experts") or 0) * 3 * hidden * expert_inter
    shared += 3 * hidden * int(cfg.get("shared_expert_intermediate_size") or 0)
    expert = 3 * hidden * expert_inter
    dense_layers = int(cfg.get("first_k_dense_replace") or 0)
    moe_layers = layers - dense_layers
    dense = dense_layers * (attn + 3 * hidden * inter)
    total = embed + dense + moe_layers * (attn + shared + experts * expert + hidden * experts)
    active = embed + dense + moe_layers * (attn + shared + top_k * expert + hidden * experts)
    return float(total), float(active)
