"""transformers 5.24's ``GlmForCausalLM`` and ``Glm4ForCausalLM`` training steps, transliterated
(``models/glm/modeling_glm.py``, ``models/glm4/modeling_glm4.py``; line numbers of GLM's file).

The model, its norm, masks and loss are Llama's (``llama.py``), the fused ``gate_up_proj`` MLP Phi-3's
(``phi3.MLP``: one ``chunk``), the interleaved half-table RoPE Helium's (``interleaved``).  What GLM does
differently:

* RoPE on the first ``rotary_dim`` of each head (:153-176: ``partial_rotary_factor``, 0.5 by default): the table
  has ``rotary_dim / 2`` frequencies (:95-101), q and k are sliced into a rotated part (an alias when it is the whole
  head) and a pass-through part, rotated over interleaved pairs, and concatenated back;
* q, k and v take ``attention_bias`` (true by default); ``o_proj`` has no bias (:220);
* GLM-4-0414 (``glm4``): sandwich norms (modeling_glm4.py:77-111): ``input_layernorm``, the attention,
  ``post_self_attn_layernorm``, the residual add; ``post_attention_layernorm``, the MLP, ``post_mlp_layernorm``, the
  add: Gemma 2's order (``gemma.DecoderLayer.forward``) with Llama's norm.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..tensors import Tensor
from . import gemma, llama
from .cohere import rotate_half
from .interleaved import half_interleaved
from .llama import B, DecoderLayer, LlamaForCausalLM, RMSNorm
from .phi3 import MLP


def rotary_parts(t: Tensor, rotary_dim: int) -> tuple[Tensor, Tensor]:
    """``t[..., :rotary_dim]`` (``t`` itself when it spans the head) and ``t[..., rotary_dim:]``."""
    width = t.shape[-1]
    rot = A.view(t, *t.shape) if rotary_dim == width else A.slice_(t, -1, 0, rotary_dim)
    return rot, A.slice_(t, -1, rotary_dim, width)


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """modeling_glm.py:153-176."""
    cos = half_interleaved(A.unsqueeze(cos, 1))
    sin = half_interleaved(A.unsqueeze(sin, 1))
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = rotary_parts(q, rotary_dim)
    k_rot, k_pass = rotary_parts(k, rotary_dim)
    q_embed = A.add(A.mul(q_rot, cos), A.mul(rotate_half(q_rot), sin))
    k_embed = A.add(A.mul(k_rot, cos), A.mul(rotate_half(k_rot), sin))
    return A.cat((q_embed, q_pass), -1), A.cat((k_embed, k_pass), -1)


class Attention(llama.Attention):
    """``GlmAttention`` (modeling_glm.py:199-259): Llama's with GLM's RoPE."""

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        return apply_rotary_pos_emb(q, k, cos, sin)


class GlmDecoderLayer(DecoderLayer):
    """``GlmDecoderLayer``: Llama's with GLM's attention and the fused MLP."""

    attention_class = Attention
    mlp_class = MLP


class Glm4DecoderLayer(gemma.DecoderLayer):
    """``Glm4DecoderLayer`` (modeling_glm4.py:66-111): Gemma 2's sandwich order with GLM's modules."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.mlp = MLP(cfg, dtype, name + ".mlp")
        # in forward's order: before the attention, after it, before the MLP (gemma.DecoderLayer.norms)
        names = ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm")
        self.norms = [RMSNorm(cfg.d_model, dtype, f"{name}.{n}") for n in names]
        self.post_feedforward_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_mlp_layernorm")

    def params(self) -> list[Tensor]:
        input_layernorm, post_self_attn_layernorm, post_attention_layernorm = self.norms  # registered in this order:
        norms = [input_layernorm, post_attention_layernorm, post_self_attn_layernorm, self.post_feedforward_layernorm]
        return self.self_attn.params() + self.mlp.params() + [n.weight for n in norms]


class GlmForCausalLM(LlamaForCausalLM):
    """``GlmForCausalLM`` / ``Glm4ForCausalLM``: Llama's model with GLM's layers and its partial rotary table."""

    def decoder_layer(self, name: str, norm) -> llama.GradientCheckpointingLayer:
        if self.cfg.hf_model_type == "glm4":
            return Glm4DecoderLayer(self.cfg, self.dtype, self.setup.attention, name)
        return GlmDecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm)

    def rotary_pairs(self) -> int:
        return self.cfg.rope_dim // 2


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B) -> GlmForCausalLM:
    """The program of ``ops.transformers.predict_step`` (the same on a meta and a cpu target)."""
    return GlmForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = [r for r in llama.unsupported(cfg, setup) if "norm, MLP" not in r]
    placement = "sandwich" if cfg.hf_model_type == "glm4" else "pre"
    if cfg.norm != "rmsnorm" or cfg.norm_placement != placement or cfg.mlp != "swiglu" or cfg.positions != "rope":
        out.append(f"a {cfg.hf_model_type} model with another norm, norm placement, MLP or positions")
    if cfg.output_bias or cfg.mlp_bias or cfg.qk_norm or cfg.sliding_window is not None:
        out.append(f"a {cfg.hf_model_type} model with an o_proj or MLP bias, q/k norms or a window")
    return out
