"""transformers 5.24's ``PhiForCausalLM`` training step, transliterated (``models/phi/modeling_phi.py``).

The masks, the rotary tables, ``apply_rotary_pos_emb``, the attention interfaces and the loss are Llama's
(``llama.py``), the LayerNorm GPT-2's (``gpt2.py``).  What Phi-1/1.5/2 does differently:

* q, k, v and ``dense`` with biases (:164-167); RoPE on the first ``rotary_ndims`` of each head (:199-213): the
  slices ``q[..., :rotary_ndims]`` (the whole head when it is all rotated: an alias) and ``q[..., rotary_ndims:]``,
  the first rotated, the two concatenated;
* the MLP (:237-250): ``fc1``, the activation (``gelu_new``: GPT-2's eight ops; ``gelu`` and
  ``gelu_pytorch_tanh``: one ``F.gelu``), ``fc2``, with biases;
* the layer (:253-292): ``attn(ln(x)) + mlp(ln(x)) + x`` from ``input_layernorm`` alone; ``resid_dropout`` and
  ``embed_dropout`` return their input at p = 0 (another p is named by ``ops.transformers.unsupported``);
* the final LayerNorm and an LM head with a bias (:400).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_activation import gelu
from ..engine import Affine
from ..tensors import Tensor, empty
from .attention import eager_attention_forward, sdpa_attention_forward
from .gpt2 import LayerNorm, gelu_new
from .layernorm_lm import LayerNormCausalLM
from .llama import (
    B,
    GradientCheckpointingLayer,
    Linear,
    apply_rotary_pos_emb,
    rotary_embedding,
)

ACTIVATIONS = {"gelu_new": gelu_new, "gelu": gelu, "gelu_pytorch_tanh": gelu}
"""``hidden_act`` -> its ops (``activations.py``: ``NewGELUActivation``; ``GELUActivation`` and ``GELUTanh``,
one ``F.gelu`` each)."""


class Attention:
    """``PhiAttention`` (modeling_phi.py:153-233)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_head
        self.head_dim, self.groups, self.scaling, self.attn = hd, h // kv, hd**-0.5, attn
        self.rotary_ndims = cfg.rope_dim
        self.q_proj = Linear(d, h * hd, True, dtype, name + ".q_proj")
        self.k_proj = Linear(d, kv * hd, True, dtype, name + ".k_proj")
        self.v_proj = Linear(d, kv * hd, True, dtype, name + ".v_proj")
        self.dense = Linear(h * hd, d, True, dtype, name + ".dense")
        self.q_layernorm = LayerNorm(hd, dtype, device, name + ".q_layernorm") if cfg.qk_norm else None
        self.k_layernorm = LayerNorm(hd, dtype, device, name + ".k_layernorm") if cfg.qk_norm else None

    def params(self) -> list[Tensor]:
        out = self.q_proj.params() + self.k_proj.params() + self.v_proj.params() + self.dense.params()
        return out + (self.q_layernorm.params() + self.k_layernorm.params() if self.q_layernorm else [])

    def part(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """``t[..., :rotary_ndims]`` (``t`` itself when it spans the head) and ``t[..., rotary_ndims:]``."""
        r = self.rotary_ndims
        rot = A.view(t, *t.shape) if r == t.shape[-1] else A.slice_(t, -1, 0, r)
        return rot, A.slice_(t, -1, r, t.shape[-1])

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :187
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = A.transpose(A.view(self.q_proj(hidden_states), *hidden_shape), 1, 2)  # :190-192
        key_states = A.transpose(A.view(self.k_proj(hidden_states), *hidden_shape), 1, 2)
        value_states = A.transpose(A.view(self.v_proj(hidden_states), *hidden_shape), 1, 2)
        if self.q_layernorm is not None:  # :194-196
            query_states = self.q_layernorm(query_states)
            key_states = self.k_layernorm(key_states)
        cos, sin = position_embeddings  # :198; the locals live until the forward returns
        query_rot, query_pass = self.part(query_states)  # :200-203
        key_rot, key_pass = self.part(key_states)  # :204-207
        query_rot, key_rot = apply_rotary_pos_emb(query_rot, key_rot, cos, sin)  # :209
        query_states = A.cat((query_rot, query_pass), -1)  # :212
        key_states = A.cat((key_rot, key_pass), -1)  # :213
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        attn_output, attn_weights = interface(self, query_states, key_states, value_states, attention_mask)  # :222
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :231
        return self.dense(attn_output), attn_weights  # :232-233


class MLP:
    """``PhiMLP`` (modeling_phi.py:236-250)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.act = ACTIVATIONS[cfg.hf_activation or "gelu_new"]
        self.fc1 = Linear(cfg.d_model, cfg.d_ff, True, dtype, name + ".fc1")
        self.fc2 = Linear(cfg.d_ff, cfg.d_model, True, dtype, name + ".fc2")

    def params(self) -> list[Tensor]:
        return self.fc1.params() + self.fc2.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(hidden_states)))  # :247-250


class DecoderLayer(GradientCheckpointingLayer):
    """``PhiDecoderLayer`` (modeling_phi.py:253-292)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        self.self_attn = Attention(cfg, dtype, attn, device, name + ".self_attn")
        self.mlp = MLP(cfg, dtype, name + ".mlp")
        self.input_layernorm = LayerNorm(cfg.d_model, dtype, device, name + ".input_layernorm")

    def params(self) -> list[Tensor]:
        return self.self_attn.params() + self.mlp.params() + self.input_layernorm.params()

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        residual = hidden_states  # :272
        hidden_states = self.input_layernorm(hidden_states)  # :274
        # :276-284; ``_`` keeps eager's probabilities until the layer returns
        attn_outputs, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        feed_forward_hidden_states = self.mlp(hidden_states)  # :287
        return A.add(A.add(attn_outputs, feed_forward_hidden_states), residual)  # :288


class PhiForCausalLM(LayerNormCausalLM):
    """``PhiForCausalLM`` with ``PhiModel`` (modeling_phi.py:312-455), labels given: the shared skeleton
    (``layernorm_lm``; :334-385, :418-455) with Phi's layers, ``final_layernorm``, its rotary embedding (:369) and the
    head's bias (:446)."""

    layer_class = DecoderLayer
    names = ("embed_tokens", "layers", "final_layernorm")
    head_bias = True

    def rotary_buffers(self) -> list[Tensor]:
        half = self.cfg.rope_dim // 2
        self.inv_freq = empty((half,), "fp32", "inv_freq")
        return [self.inv_freq, empty((half,), "fp32", "original_inv_freq")]

    def rotary(self, hidden_states: Tensor, position_ids: Tensor):
        return rotary_embedding(hidden_states, position_ids, self.inv_freq)


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> PhiForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return PhiForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.norm != "layernorm" or cfg.mlp != "gelu" or cfg.parallel_block != "one_norm" or cfg.moe:
        out.append("a phi model with another norm, MLP or block")
    if (cfg.hf_activation or "gelu_new") not in ACTIVATIONS:
        out.append(f"hidden_act {cfg.hf_activation} (its ops are not transliterated: {', '.join(ACTIVATIONS)} are)")
    return out
