"""transformers 5.24's ``OlmoeForCausalLM`` training step, transliterated (``models/olmoe/modeling_olmoe.py``).

The model, its masks (``create_causal_mask``, no window), its rotary table, its norms (``OlmoeRMSNorm`` =
Llama's) and its loss are Llama's (``llama.py``); the sparse block is Qwen3-MoE's (``moe.py``): the router
(``OlmoeTopKRouter``: softmax with ``dtype=torch.float``, top-k, the division only with ``norm_topk_prob``, the
values cast back to the logits' dtype) and the experts under ``grouped_mm`` (``OlmoeExperts`` is
``@use_experts_implementation``).  What OLMoE does differently:

* ``OlmoeAttention`` (:197-265) normalizes q and k over the whole projection before the heads are split, as
  OLMo-2 does (``olmo2.Attention``), but with Llama's RMSNorm and Llama's RoPE (cos and sin in the activations'
  dtype, no cast back); ``clip_qkv`` only null (``hf_config``: no clamp);
* ``OlmoeSparseMoeBlock`` registers the router ``gate`` before the ``experts`` (:339-344; Qwen3-MoE the reverse),
  which orders ``model.parameters()`` and so the for-loop AdamW;
* every layer is sparse (no ``decoder_sparse_step``).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from ..engine import Affine
from ..tensors import Tensor
from . import llama, moe, olmo2
from .llama import B


class Attention(olmo2.Attention):
    """``OlmoeAttention``: OLMo-2's whole-projection q/k norms with Llama's RMSNorm and RoPE."""

    norm = llama.RMSNorm

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm=None):
        super().__init__(cfg, dtype, attn, name)

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        return llama.apply_rotary_pos_emb(q, k, cos, sin)


class SparseMoeBlock(moe.SparseMoeBlock):
    """``OlmoeSparseMoeBlock``: Qwen3-MoE's router and experts, the router registered first."""

    def params(self) -> list[Tensor]:
        return [self.gate.weight] + self.experts.params()


class DecoderLayer(llama.DecoderLayer):
    """``OlmoeDecoderLayer`` (:355-395): Llama's layer with OLMoE's attention and sparse block."""

    attention_class = Attention
    mlp_class = SparseMoeBlock


class OlmoeForCausalLM(llama.LlamaForCausalLM):
    """``OlmoeForCausalLM`` without ``output_router_logits`` (no auxiliary loss)."""

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> OlmoeForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return OlmoeForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = moe.unsupported(cfg, setup)
    if not cfg.qk_norm or cfg.qk_norm_scope != "projection" or cfg.sliding_window is not None:
        out.append("an olmoe model without whole-projection q/k norms, or with a window")
    return out
