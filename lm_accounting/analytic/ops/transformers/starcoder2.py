"""transformers 5.24's ``Starcoder2ForCausalLM`` training step, transliterated (``models/starcoder2/
modeling_starcoder2.py``).

The skeleton is the LayerNorm models' (``layernorm_lm``: the embedding kept, one mask, a final LayerNorm, the
head on an alias of the normed states), the attention Llama's (``llama.Attention``: biases on q, k, v and o when
``use_bias``, RoPE on the whole head), the layer Llama's order (``llama.DecoderLayer.forward``), the LayerNorm
GPT-2's and the activations Phi's.  What StarCoder2 does differently:

* ``nn.LayerNorm`` with a bias for ``input_layernorm``, ``post_attention_layernorm`` and ``norm`` (:212-213, :323);
* the MLP (:53-67): ``c_fc``, the activation (``hidden_act``, ``gelu_pytorch_tanh`` by default), ``c_proj``;
* ``residual_dropout`` after ``o_proj`` and ``c_proj`` and ``embedding_dropout`` after the lookup (:66, :199, :368)
  return their input at p = 0 (another p is named by ``ops.transformers.unsupported``);
* the mask (:358): ``create_sliding_window_causal_mask`` when ``sliding_window`` is set (every layer), else
  ``create_causal_mask``.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from ..engine import Affine
from ..tensors import Tensor
from .gpt2 import LayerNorm
from .layernorm_lm import LayerNormCausalLM
from .llama import Attention, B, DecoderLayer, Linear, rotary_embedding
from .phi import ACTIVATIONS


class MLP:
    """``Starcoder2MLP`` (modeling_starcoder2.py:53-67)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.act = ACTIVATIONS[cfg.hf_activation or "gelu_pytorch_tanh"]
        self.c_fc = Linear(cfg.d_model, cfg.d_ff, cfg.mlp_bias, dtype, name + ".c_fc")
        self.c_proj = Linear(cfg.d_ff, cfg.d_model, cfg.mlp_bias, dtype, name + ".c_proj")

    def params(self) -> list[Tensor]:
        return self.c_fc.params() + self.c_proj.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        return self.c_proj(self.act(self.c_fc(hidden_states)))  # :63-65


class Starcoder2DecoderLayer(DecoderLayer):
    """``Starcoder2DecoderLayer`` (modeling_starcoder2.py:206-245): Llama's forward with LayerNorms."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.mlp = MLP(cfg, dtype, name + ".mlp")
        self.input_layernorm = LayerNorm(cfg.d_model, dtype, device, name + ".input_layernorm")
        self.post_attention_layernorm = LayerNorm(cfg.d_model, dtype, device, name + ".post_attention_layernorm")

    def params(self) -> list[Tensor]:
        norms = self.input_layernorm.params() + self.post_attention_layernorm.params()
        return self.self_attn.params() + self.mlp.params() + norms


class Starcoder2ForCausalLM(LayerNormCausalLM):
    """``Starcoder2ForCausalLM`` with ``Starcoder2Model`` (modeling_starcoder2.py:313-460), labels given: the shared
    skeleton (``layernorm_lm``) with StarCoder2's layers, its window (``window``) and Llama's rotary embedding
    (:371)."""

    layer_class = Starcoder2DecoderLayer

    def window(self) -> int | None:
        return self.cfg.sliding_window

    def rotary(self, hidden_states: Tensor, position_ids: Tensor):
        return rotary_embedding(hidden_states, position_ids, self.inv_freq)


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> Starcoder2ForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return Starcoder2ForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.norm != "layernorm" or cfg.mlp != "gelu" or cfg.parallel_block != "none" or cfg.moe or cfg.qk_norm:
        out.append("a starcoder2 model with another norm, MLP, block, experts or q/k norms")
    if (cfg.hf_activation or "gelu_pytorch_tanh") not in ACTIVATIONS:
        out.append(f"hidden_act {cfg.hf_activation} (its ops are not transliterated: {', '.join(ACTIVATIONS)} are)")
    return out
