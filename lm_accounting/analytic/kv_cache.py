"""The KV cache of inference, with sliding-window layers: exact ints of bytes, no torch.

Each layer caches one key and one value vector of ``kv_heads · d_head`` per cached token.  A
full-attention layer caches every one of the S tokens; a sliding-window layer (``cfg.layer_windowed``)
only the last ``min(S, w)``, the keys its newest query attends to (itself included; the
window rule of transformers' ``sliding_window_causal_mask_function``, i - w < j <= i).

    KV cache = 2 · kv_heads · d_head · B · bytes · Σ_layers cached(layer),
    cached(layer) = min(S, w) on a windowed layer, S otherwise.

Without a window this is the plain 2 · L · kv_heads · d_head · S · B · bytes; latent attention caches
(kv_lora_rank + qk_rope_head_dim) per token per layer instead of 2 · kv_heads · d_head.  transformers'
``DynamicSlidingWindowLayer`` (cache_utils.py, v5) keeps ``w - 1`` tokens between decode steps and
concatenates the new token's key and value for the step, so ``w`` is the size during a step (its peak).
"""

from __future__ import annotations

from ..config import ModelConfig
from ..names import DTYPE_BYTES


def cached_tokens(cfg: ModelConfig, seq: int) -> int:
    """Tokens cached over all layers at context ``seq``: Σ_layers (min(S, w) if windowed else S)."""
    windowed = cfg.windowed_layers
    per_window = seq if cfg.sliding_window is None else min(seq, cfg.sliding_window)
    return (cfg.num_layers - windowed) * seq + windowed * per_window


def windowed_kv_cache_bytes(cfg: ModelConfig, seq: int, batch: int, dtype: str) -> int:
    """K and V for every layer and cached token, windowed layers keeping only their window:
    2 · kv_heads · d_head · B · bytes · ``cached_tokens(cfg, S)``.  Under latent attention (MLA) a token's
    entry is the latent and the shared RoPE key, (kv_lora_rank + qk_rope_head_dim) elements instead of
    2 · kv_heads · d_head (``ModelConfig.kv_cache_width``; DeepSeek-V2 §2.1.2, transformers v5's cache)."""
    return cfg.kv_cache_width * cached_tokens(cfg, seq) * batch * DTYPE_BYTES[dtype]
