"""The from-scratch CS336 Transformer LM that the analytic counts are proved against."""

from lm_accounting.model.layers import (
    Embedding,
    FusedAttention,
    Linear,
    MatMul,
    RMSNorm,
    RotaryPositionalEmbedding,
    SwiGLU,
    cross_entropy,
    scaled_dot_product_attention,
    silu,
    softmax,
)
from lm_accounting.model.transformer import (
    CausalSelfAttention,
    TransformerBlock,
    TransformerLM,
    build_model,
    random_tokens,
)

__all__ = [
    "CausalSelfAttention",
    "Embedding",
    "FusedAttention",
    "Linear",
    "MatMul",
    "RMSNorm",
    "RotaryPositionalEmbedding",
    "SwiGLU",
    "TransformerBlock",
    "TransformerLM",
    "build_model",
    "cross_entropy",
    "random_tokens",
    "scaled_dot_product_attention",
    "silu",
    "softmax",
]
