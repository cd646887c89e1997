"""transformers 5.24's ``HeliumForCausalLM`` and ``Ernie4_5ForCausalLM`` training steps, transliterated
(``models/helium/modeling_helium.py``, ``models/ernie4_5/modeling_ernie4_5.py``): Llama's model, layer, MLP,
masks and loss (``llama.py``) with RoPE over interleaved pairs (Cohere's ``rotate_half``, ``cohere.py``).

Their ``apply_rotary_pos_emb`` (helium :170-198, ernie4_5 :151-184) takes the first half of the cat-ed cos and sin
and ``repeat_interleave``s it (a slice, then a contiguous copy per layer that the products save), and rotates
``x[..., 0::2]`` / ``x[..., 1::2]`` (``stack((-x2, x1), -1).flatten(-2)``).  Beyond that:

* Helium: ``HeliumRMSNorm`` multiplies by ``weight.to(float32)`` before the cast back (:57-58); ``o_proj`` is
  ``hidden_size`` square without a bias (:223; q, k and v take ``attention_bias``);
* ERNIE 4.5: ``Ernie4_5RotaryEmbedding`` keeps cos and sin in fp32 (:86, OLMo-2's ``olmo2.rotary_embedding``), and
  the products run on ``q.float()`` and ``rotate_half(q).float()``, cast back to q's dtype; ``use_bias`` on every
  projection; attention dropout fixed at 0 (:195).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..tensors import Tensor
from . import llama, olmo2
from .cohere import repeat_interleave, rotate_half
from .llama import B, DecoderLayer, LlamaForCausalLM


def half_interleaved(t: Tensor) -> Tensor:
    """``t[..., : t.shape[-1] // 2].repeat_interleave(2, dim=-1)``."""
    return repeat_interleave(A.slice_(t, -1, 0, t.shape[-1] // 2))


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, upcast: bool) -> tuple[Tensor, Tensor]:
    """Helium's (``upcast`` False) and ERNIE 4.5's (``upcast``: the products in fp32, cast back) RoPE."""
    dtype = q.dtype
    cos = half_interleaved(A.unsqueeze(cos, 1))
    sin = half_interleaved(A.unsqueeze(sin, 1))
    up = (lambda t: A.to(t, "fp32")) if upcast else (lambda t: t)
    q_embed = A.add(A.mul(up(q), cos), A.mul(up(rotate_half(q)), sin))
    k_embed = A.add(A.mul(up(k), cos), A.mul(up(rotate_half(k)), sin))
    return (A.to(q_embed, dtype), A.to(k_embed, dtype)) if upcast else (q_embed, k_embed)


class HeliumRMSNorm(llama.RMSNorm):
    """``HeliumRMSNorm`` (modeling_helium.py:46-58)."""

    def __call__(self, hidden_states: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = A.to(hidden_states, "fp32")
        variance = A.mean(A.pow_(hidden_states, 2), -1, keepdim=True)
        hidden_states = A.mul(hidden_states, A.rsqrt(A.add(variance, 1e-6)))
        return A.to(A.mul(A.to(self.weight, "fp32"), hidden_states), input_dtype)  # :58


class Attention(llama.Attention):
    """``HeliumAttention`` / ``Ernie4_5Attention``: Llama's with the interleaved RoPE."""

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        return apply_rotary_pos_emb(q, k, cos, sin, upcast=self.upcast)


class HeliumAttention(Attention):
    upcast = False


class ErnieAttention(Attention):
    upcast = True


class HeliumDecoderLayer(DecoderLayer):
    attention_class = HeliumAttention


class ErnieDecoderLayer(DecoderLayer):
    attention_class = ErnieAttention


class HeliumForCausalLM(LlamaForCausalLM):
    """``HeliumForCausalLM`` (modeling_helium.py): Llama's with Helium's norm and attention."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B):
        super().__init__(cfg, seq, setup, batch, norm=HeliumRMSNorm)

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return HeliumDecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm)


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    """``Ernie4_5ForCausalLM`` (modeling_ernie4_5.py): Llama's with ERNIE 4.5's rotary table and attention."""

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return ErnieDecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm)

    def rotary(self, hidden_states: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        return olmo2.rotary_embedding(position_ids, self.inv_freq)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B) -> LlamaForCausalLM:
    """The program of ``ops.transformers.predict_step`` (the same on a meta and a cpu target)."""
    return (HeliumForCausalLM if cfg.hf_model_type == "helium" else Ernie4_5ForCausalLM)(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = llama.unsupported(cfg, setup)
    if cfg.qk_norm or cfg.sliding_window is not None:
        out.append(f"a {cfg.hf_model_type} model with q/k norms or a window")
    return out
