"""Trainable parameter counts, one function per component.

Source: the CS336 (Stanford, spring 2025) assignment-1 architecture, handout section 3: bias-free
``Linear`` weights of shape (out, in), an RMSNorm gain per normalised vector,
no position table (RoPE has no parameters).  GQA (Ainslie et al. 2023) shrinks
K/V to ``kv_heads * d_head`` outputs; Qwen3's qk-norm adds one ``d_head`` gain each
for Q and K; tied embeddings (Press & Wolf 2017) make the LM head free.

Architecture options (``ModelConfig``; checked against transformers' own modules in
tests/test_transformers_truth.py): LayerNorm has a gain and a bias per feature (Ba et al. 2016;
``torch.nn.LayerNorm``, GPT-2's ``ln_1``/``ln_2``/``ln_f``); a projection bias has one entry per
output feature (``nn.Linear(bias=True)``, GPT-2's ``Conv1D``, Qwen2's q/k/v); GPT-2's learned
position table is ``n_positions x d`` (``wpe``); the 2-matrix GELU MLP is ``fc`` (d -> d_ff) and
``proj`` (d_ff -> d); OLMo-2's qk-norm is one RMSNorm over the whole Q (``h·d_head``) and K
(``kv·d_head``) projection; sandwich and post norms (Gemma 2/3, OLMo-2) are RMSNorms of d.  gpt-oss (transformers' modeling_gpt_oss.py):
``GptOssAttention.sinks`` is h per layer, ``GptOssTopKRouter.bias`` E, ``GptOssExperts.gate_up_proj_bias``
(E, 2·d_e) and ``down_proj_bias`` (E, d); Qwen2-MoE's ``shared_expert_gate`` is ``nn.Linear(d, 1, bias=False)``.
"""

from __future__ import annotations

from ..breakdown import Breakdown
from ..config import ModelConfig


def embedding_params(cfg: ModelConfig) -> int:
    """Token embedding table, vocab_size x d_model."""
    return cfg.vocab_size * cfg.d_model


def q_proj_params(cfg: ModelConfig) -> int:
    """W_Q: d_model -> num_heads * d_head."""
    return cfg.d_model * cfg.q_dim


def kv_proj_params(cfg: ModelConfig) -> int:
    """W_K or W_V (each): d_model -> kv_heads * d_head."""
    return cfg.d_model * cfg.kv_dim


def output_proj_params(cfg: ModelConfig) -> int:
    """W_O: num_heads * v_head -> d_model (v_head = d_head except under latent attention)."""
    return cfg.o_dim * cfg.d_model


# -- multi-head latent attention (DeepSeek-V2 §2.1; transformers' DeepseekV3Attention) --
def q_a_proj_params(cfg: ModelConfig) -> int:
    """W_DQ, the query down-projection: d_model -> q_lora_rank."""
    return cfg.d_model * cfg.q_lora_rank


def q_b_proj_params(cfg: ModelConfig) -> int:
    """W_UQ (with W_QR), the query up-projection: q_lora_rank -> num_heads·(qk_nope + qk_rope)."""
    return cfg.q_lora_rank * cfg.q_dim


def kv_a_proj_params(cfg: ModelConfig) -> int:
    """W_DKV with W_KR: d_model -> kv_lora_rank + qk_rope_head_dim (the latent and the shared RoPE key)."""
    return cfg.d_model * cfg.kv_cache_width


def kv_b_proj_params(cfg: ModelConfig) -> int:
    """W_UK and W_UV: kv_lora_rank -> num_heads·(qk_nope_head_dim + v_head_dim)."""
    return cfg.kv_lora_rank * cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)


# -- mixture of experts (Mixtral, Qwen3-MoE, DeepSeek; transformers' *Experts, *TopKRouter) --
def sink_params(cfg: ModelConfig) -> int:
    """Attention sinks (gpt-oss's ``GptOssAttention.sinks``): one learned logit per query head."""
    return cfg.num_heads


def router_params(cfg: ModelConfig) -> int:
    """The router: d_model -> num_experts (its bias, gpt-oss's ``GptOssTopKRouter.bias``, is the registry's
    ``moe.router.bias``; DeepSeek-V3's score-correction bias is a buffer)."""
    return cfg.d_model * cfg.num_experts


def expert_matrix_params(cfg: ModelConfig) -> int:
    """One matrix (W1, W2 or W3) of every routed expert together: num_experts x d_model x expert_d_ff."""
    return cfg.num_experts * cfg.d_model * cfg.expert_width


def shared_gate_params(cfg: ModelConfig) -> int:
    """Qwen2-MoE's ``shared_expert_gate``: ``nn.Linear(d_model, 1, bias=False)``."""
    return cfg.d_model


def shared_matrix_params(cfg: ModelConfig) -> int:
    """One matrix of the shared experts (run as one SwiGLU): d_model x shared_experts·shared_expert_d_ff."""
    return cfg.d_model * cfg.shared_width


def expert_params(cfg: ModelConfig) -> int:
    """One routed expert's parameters: its 3 SwiGLU matrices, 3·d·d_e, and with ``expert_bias`` (gpt-oss's
    ``gate_up_proj_bias`` and ``down_proj_bias``) its biases, 2·d_e + d; a layer pattern's E expert (Nemotron-H's,
    ``up_proj`` and ``down_proj``, no gate, no bias) 2·d_in·d_e, d_in = ``expert_in``."""
    if cfg.pattern_experts:
        return 2 * cfg.expert_in * cfg.expert_width
    bias = 2 * cfg.expert_width + cfg.d_model if cfg.expert_bias else 0
    return 3 * cfg.d_model * cfg.expert_width + bias


# -- Gated DeltaNet (transformers' Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet; config.LINEAR_FIELDS) --
def linear_in_proj_params(cfg: ModelConfig, out: int) -> int:
    """One of a Gated DeltaNet layer's input projections, d_model -> ``out`` (q,k,v: 2·key_dim + value_dim;
    z: value_dim; b and a: one per value head); Qwen3-Next fuses them as ``in_proj_qkvz`` and ``in_proj_ba``."""
    return cfg.d_model * out


def linear_conv_params(cfg: ModelConfig) -> int:
    """The depthwise conv1d over q, k and v, no bias: ``nn.Conv1d(conv_dim, conv_dim, K, groups=conv_dim)``,
    weight (conv_dim, 1, K)."""
    return cfg.linear_conv_dim * cfg.linear_conv_kernel


# -- DeepSeek Sparse Attention's indexer (transformers' DeepseekV32Indexer; config.DSA_FIELDS) --
def indexer_q_params(cfg: ModelConfig) -> int:
    """``wq_b``: the query latent to the indexer's heads, q_lora_rank -> index_heads·index_head_dim."""
    return cfg.q_lora_rank * cfg.index_heads * cfg.index_head_dim


def indexer_k_params(cfg: ModelConfig) -> int:
    """``wk``: the hidden state to the indexer's one key, d_model -> index_head_dim."""
    return cfg.d_model * cfg.index_head_dim


def indexer_weights_params(cfg: ModelConfig) -> int:
    """``weights_proj``: the hidden state to one weight per indexer head, d_model -> index_heads."""
    return cfg.d_model * cfg.index_heads


def active_parameter_count(cfg: ModelConfig) -> int:
    """Parameters one token uses: every parameter except the routed experts it is not sent to,
    total − L_moe·(E − k)·(one expert's, ``expert_params``).  Embeddings, router and shared
    experts count as active; equal to the total for a dense model."""
    total = parameter_breakdown(cfg).total
    if not cfg.moe:
        return total
    idle = cfg.num_experts - cfg.experts_per_token
    return total - cfg.moe_layers * idle * expert_params(cfg)


def ffn_matrix_params(cfg: ModelConfig) -> int:
    """One SwiGLU matrix (W1, W2 or W3): d_model x d_ff."""
    return cfg.d_model * cfg.d_ff


def rmsnorm_params(width: int) -> int:
    """RMSNorm gain: one per feature (no bias, unlike LayerNorm)."""
    return width


def layernorm_params(width: int) -> int:
    """LayerNorm gain and bias: two per feature."""
    return 2 * width


def norm_params(cfg: ModelConfig, width: int) -> int:
    """The config's norm (``cfg.norm``) over ``width`` features: RMSNorm ``width``, LayerNorm ``2·width``; none
    without weights (``norm_weights = false``, OLMo's ``OlmoLayerNorm``); a LayerNorm without bias (``norm_bias =
    false``, Cohere's ``CohereLayerNorm``) ``width``."""
    if not cfg.norm_weights:
        return 0
    if cfg.norm == "layernorm" and cfg.norm_bias:
        return layernorm_params(width)
    return rmsnorm_params(width)


def qk_norm_params(cfg: ModelConfig, heads: int) -> int:
    """Q norm (``heads`` = h) or K norm (``heads`` = kv): an RMSNorm of ``d_head`` per head shared by every
    head (Qwen3, Gemma 3), or over the whole projection, ``heads·d_head`` (OLMo-2), or a gain of ``d_head`` per
    head, ``heads·d_head`` (Cohere); with ``norm = layernorm`` a LayerNorm: twice that with a bias (Phi)."""
    width = cfg.d_head if cfg.qk_norm_scope == "head" else heads * cfg.d_head
    return layernorm_params(width) if cfg.norm == "layernorm" and cfg.norm_bias else width


def bias_params(width: int) -> int:
    """A projection's bias: one per output feature."""
    return width


def position_embedding_params(cfg: ModelConfig) -> int:
    """Learned absolute positions (GPT-2's ``wpe``): max_position_embeddings x d_model."""
    return cfg.position_rows * cfg.d_model


def lm_head_params(cfg: ModelConfig) -> int:
    """Output projection d_model -> vocab_size; zero extra when tied to the embedding."""
    return 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model


def frozen_parameter_count(cfg: ModelConfig) -> int:
    """Parameters with ``requires_grad=False`` (the registry's ``frozen`` components: Ernie 4.5's router score
    bias), or that no backward reaches (DeepSeek-V3.2's indexer, run under ``torch.no_grad()``): counted by
    ``parameters()``, but with no gradient and no AdamW state."""
    from ..components import component

    return sum(it.total for it in parameter_breakdown(cfg) if component(it.key).frozen)


def parameter_breakdown(cfg: ModelConfig) -> Breakdown:
    """Exact parameter count per component; ``total`` equals ``sum(p.numel())`` of the live model.

    Built from ``components.REGISTRY``, in the live model's ``named_parameters()`` order."""
    from ..components import breakdown
    from .sizes import Sizes

    return breakdown("params", Sizes(cfg))


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters one token multiplies by: every weight matrix (the LM head even when tied; the
    router; for a mixture of experts only the top-k routed experts), i.e. the weight matmul FLOPs of
    one token / 2, read from the component registry (every ``flops`` entry but the attention matmuls).

    This is the N of the PaLM estimate (Chowdhery et al. 2022, appendix B): the embedding lookups
    (tokens and learned positions) do no matmul, and norm gains and biases are elementwise.  A Gated DeltaNet
    layer's chunked core and causal conv (group "linear attention") grow with the padded sequence, not per
    token: they are left out like the attention matmuls (``flops.training_flops`` adds them back).
    """
    from ..components import breakdown
    from .sizes import Sizes

    one_token = breakdown("flops", Sizes(cfg, 1, 1))
    return sum(it.total for it in one_token if it.group not in ("attention matmuls", "linear attention")) // 2
