"""transformers 5.24's ``Glm4MoeForCausalLM`` training step (GLM-4.5/4.6), transliterated
(``models/glm4_moe/modeling_glm4_moe.py``).

The model, its mask (``create_causal_mask``), its norms and its loss are Llama's (``llama.py``); the sparse block
is DeepSeek-V3's line for line (``deepseek.MoE``: ``Glm4MoeTopkRouter`` = ``DeepseekV3TopkRouter``, sigmoid scores,
group-limited top-k, the fp32 router weight and ``e_score_correction_bias``; the experts under ``grouped_mm``; the
shared experts one MLP of ``moe_intermediate_size × n_shared_experts``), from layer ``first_k_dense_replace`` on
(``Glm4MoeMLP`` of ``intermediate_size`` before: ``moe.MoeDecoderLayer``).  What GLM-4-MoE does differently:

* ``Glm4MoeAttention.forward`` (:204-253): q, k, v projected and viewed per head, then the per-head q/k RMSNorms
  with ``use_qk_norm`` (``llama.Attention.norm_at`` "projected"), transposed, then RoPE on the first ``rotary_dim`` of each
  head (``partial_rotary_factor``, :141-172: ``q[..., :rotary_dim]`` rotated by Llama's ``rotate_half``,
  concatenated back with ``q[..., rotary_dim:]``: StableLM's ``stablelm.Attention``); q/k/v biases with
  ``attention_bias``, none on o;
* the rotary table has ``rotary_dim / 2`` frequencies (:72-80).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from ..engine import Affine
from . import deepseek, moe, stablelm
from .llama import B


class Attention(stablelm.Attention):
    """``Glm4MoeAttention``: StableLM's partial RoPE, the per-head q/k norms once q, k and v are projected."""

    norm_at = "projected"


class DecoderLayer(moe.MoeDecoderLayer):
    """``Glm4MoeDecoderLayer`` (:395-440): Llama's layer with GLM-4-MoE's attention, DeepSeek-V3's sparse block from
    ``first_k_dense_replace`` on."""

    attention_class = Attention
    sparse_class = deepseek.MoE


class Glm4MoeForCausalLM(moe.MoeForCausalLM):
    """``Glm4MoeForCausalLM`` with ``Glm4MoeModel`` (Llama's forward)."""

    layer_class = DecoderLayer

    def rotary_pairs(self) -> int:
        return self.cfg.rope_dim // 2


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> Glm4MoeForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return Glm4MoeForCausalLM(cfg, seq, setup, batch)


def fp32_kept_parameters(cfg: ModelConfig) -> int:
    """The router weights (E, d) of the sparse layers: made fp32 in a 16-bit model (``Glm4MoeTopkRouter.__init__``:
    ``dtype=torch.float32``), as DeepSeek-V3's."""
    return deepseek.fp32_kept_parameters(cfg)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """DeepSeek-V3's (the router's groups); the attention is GLM's (partial RoPE, per-head q/k norms)."""
    return deepseek.unsupported(cfg, setup)
