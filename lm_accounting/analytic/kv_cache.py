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

A Gated DeltaNet hybrid (Qwen3-Next, Qwen3.5) caches K and V on its attention layers only, and on each linear
layer a fixed state whatever the context (``linear_state_bytes``; transformers' ``LinearAttentionLayer``,
cache_utils.py): the conv state, the last K inputs of the conv, (B, conv_dim, K) in the model's dtype, and the
recurrent state, (B, H_v, d_k, d_v) in fp32 (``torch_chunk_gated_delta_rule`` computes it in fp32 and the cache
keeps ``zeros_like`` it).  tests/test_arch_qwen3_next.py checks both against the cache object after a prefill.
A Mamba2 layer (Nemotron-H's ``M``) likewise keeps a conv state, (B, conv_dim, K) in the model's dtype, and the SSM
state, (B, H, P, N) in fp32 (``mamba2_chunk_scan`` computes in fp32 and hands its final state to the cache as it
is); tests/test_arch_mamba2.py checks them.  An LFM2 short-convolution layer (``C``) keeps its conv state only,
(B, d, K) in the model's dtype (``Lfm2ShortConv`` hands B·x to ``update_conv_state`` with ``conv_L_cache`` as K;
the ``LinearAttentionLayer`` of the ``"conv"`` layer type, cache_utils.py); tests/test_arch_lfm2.py checks it.
is); tests/test_arch_mamba2.py checks them.  A Mamba (v1) layer (``S``: Mamba, Falcon-Mamba, Jamba) keeps its conv
state, (B, E, K) in the model's dtype, and the SSM state, (B, E, N) in fp32 (the scan's discretised A is fp32, so
its state is; ``mamba_selective_scan`` hands it to the cache as it is); tests/test_arch_mamba.py checks them.
"""

from __future__ import annotations

from ..config import ModelConfig
from ..names import DTYPE_BYTES


def cached_tokens(cfg: ModelConfig, seq: int) -> int:
    """Tokens cached over all layers at context ``seq``: Σ_layers (min(S, w) if windowed else S)."""
    windowed = cfg.windowed_layers
    per_window = seq if cfg.sliding_window is None else min(seq, cfg.sliding_window)
    return (cfg.attention_layers - windowed) * seq + windowed * per_window  # a hybrid's linear layers cache no K, V


RECURRENT_STATE_BYTES = 4
"""The recurrent state's element size: fp32 whatever the model's dtype (``torch_chunk_gated_delta_rule`` returns
its final state in fp32, ``LinearAttentionLayer`` keeps it as it comes)."""


def linear_state_bytes(cfg: ModelConfig, batch: int, dtype: str) -> int:
    """A hybrid's fixed cache: on every Gated DeltaNet layer the conv state, B · conv_dim · K elements of ``dtype``,
    and the recurrent state, B · H_v · d_k · d_v fp32 elements; on every Mamba2 layer the conv state,
    B · conv_dim · K of ``dtype``, and the SSM state, B · H · P · N fp32 elements; on every LFM2 short-convolution
    layer its conv state, B · d · K of ``dtype``; 0 without such layers."""
    total = 0
    if cfg.hybrid:
        conv = batch * cfg.linear_conv_dim * cfg.linear_conv_kernel * DTYPE_BYTES[dtype]
        state = batch * cfg.linear_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
        total += cfg.linear_layers * (conv + state * RECURRENT_STATE_BYTES)
    if cfg.mamba_layers:
        conv = batch * cfg.mamba_conv_dim * cfg.mamba_conv_kernel * DTYPE_BYTES[dtype]
        state = batch * cfg.mamba_heads * cfg.mamba_head_dim * cfg.mamba_state_size
        total += cfg.mamba_layers * (conv + state * RECURRENT_STATE_BYTES)
    if cfg.short_conv_layers:  # LFM2: the conv state alone, no recurrent state
        total += cfg.short_conv_layers * batch * cfg.d_model * cfg.short_conv_kernel * DTYPE_BYTES[dtype]
    if cfg.ssm_layers:  # Mamba (v1): B · E · K of dtype and B · E · N fp32
        conv = batch * cfg.ssm_inner * cfg.ssm_conv_kernel * DTYPE_BYTES[dtype]
        state = batch * cfg.ssm_inner * cfg.ssm_state_size
        total += cfg.ssm_layers * (conv + state * RECURRENT_STATE_BYTES)
    return total


def windowed_kv_cache_bytes(cfg: ModelConfig, seq: int, batch: int, dtype: str) -> int:
    """K and V for every layer and cached token, windowed layers keeping only their window:
    2 · kv_heads · d_head · B · bytes · ``cached_tokens(cfg, S)``.  Under latent attention (MLA) a token's
    entry is the latent and the shared RoPE key, (kv_lora_rank + qk_rope_head_dim) elements instead of
    2 · kv_heads · d_head (``ModelConfig.kv_cache_width``; DeepSeek-V2 §2.1.2, transformers v5's cache), and
    DeepSeek Sparse Attention's indexer key, d_I more on each layer with an indexer (``indexer_layers``; no window)."""
    indexer = cfg.index_head_dim * cfg.indexer_layers * seq if cfg.indexer else 0
    return (cfg.kv_cache_width * cached_tokens(cfg, seq) + indexer) * batch * DTYPE_BYTES[dtype]
