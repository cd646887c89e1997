"""transformers 5.24's ``OlmoForCausalLM`` training step, transliterated (``models/olmo/modeling_olmo.py``).

The model, layer order, MLP, masks and loss are Llama's (``llama.py``), the rotary table and ``apply_rotary_pos_emb``
OLMo-2's (``olmo2``: cos and sin kept fp32, q and k cast back after the products).  What OLMo (v1) does differently:

* ``OlmoLayerNorm`` (:47-58): ``F.layer_norm(x.to(float32), (d,), None, None, eps=1e-5).to(orig_dtype)``, no
  weight and no bias, for both norms of a layer and the final one (no parameter: ``norm_weights`` false);
* q, k and v projected first, then viewed (:190-200; ``clip_qkv`` only null: no clamp);
* biases on q, k, v and o with ``attention_bias``.
"""

from __future__ import annotations

from functools import partial

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_layer_norm import layer_norm
from ..tensors import Tensor
from . import llama, olmo2
from .llama import B, DecoderLayer, LlamaForCausalLM


class LayerNorm:
    """``OlmoLayerNorm`` (modeling_olmo.py:47-58): no parameter."""

    def __init__(self, size: int, dtype: str, name: str, device: str = "meta"):
        self.device = device

    def __call__(self, hidden_states: Tensor) -> Tensor:
        orig_dtype = hidden_states.dtype
        return A.to(layer_norm(A.to(hidden_states, "fp32"), None, None, device=self.device), orig_dtype)


class Attention(llama.Attention):
    """``OlmoAttention``: Llama's with OLMo-2's RoPE (its fp32 products cast back)."""

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        return olmo2.apply_rotary_pos_emb(q, k, cos, sin)


class OlmoDecoderLayer(DecoderLayer):
    """``OlmoDecoderLayer``: Llama's with weightless norms."""

    attention_class = Attention

    def params(self) -> list[Tensor]:
        return self.self_attn.params() + self.mlp.params()


class OlmoForCausalLM(LlamaForCausalLM):
    """``OlmoForCausalLM`` with ``OlmoModel``: Llama's with OLMo's layers, final norm and rotary table."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B, device: str = "meta"):
        super().__init__(cfg, seq, setup, batch, norm=partial(LayerNorm, device=device))

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return OlmoDecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm)

    def parameters(self) -> list[Tensor]:
        out = [self.embed_tokens]
        for layer in self.layers:
            out += layer.params()
        return out + ([self.lm_head] if self.lm_head is not None else [])

    def rotary(self, hidden_states: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        return olmo2.rotary_embedding(position_ids, self.inv_freq)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B, device: str = "meta") -> OlmoForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return OlmoForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = [r for r in llama.unsupported(cfg, setup) if "norm, MLP" not in r]
    if cfg.norm != "layernorm" or cfg.norm_weights or cfg.norm_placement != "pre" or cfg.mlp != "swiglu":
        out.append("an olmo model with another norm, norm placement or MLP")
    if cfg.qk_norm or cfg.mlp_bias or cfg.sliding_window is not None:
        out.append("an olmo model with q/k norms, MLP biases or a window")
    return out
