"""transformers 5.24's ``StableLmForCausalLM`` training step, transliterated (``models/stablelm/modeling_stablelm.py``).

The skeleton is the LayerNorm models' (``layernorm_lm``: the embedding kept, one causal mask, a final LayerNorm with
its bias, the head on an alias of the normed states), the projections and ``apply_rotary_pos_emb`` Llama's
(``llama.Attention``, Llama's cat-ed table of ``rotary_ndims``), the rotated share sliced as GLM's
(``glm.rotary_parts``: ``q[..., :rotary_ndims]``, ``q[..., rotary_ndims:]``, rotated, concatenated back).  What
StableLM does differently:

* biases on q, k and v with ``use_qkv_bias``; ``o_proj`` (``hidden_size`` square) has none;
* ``nn.LayerNorm`` with a bias for ``input_layernorm``, ``post_attention_layernorm`` and ``norm``;
* the layer (``StableLmDecoderLayer``): with ``use_parallel_residual``, ``residual + attention + mlp`` both from
  ``input_layernorm`` (no ``post_attention_layernorm``); else ``residual = residual + attention``, then
  ``residual + mlp(post_attention_layernorm(residual))``; its ``hidden_dropout`` (p = 0) returns its input.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..engine import Affine
from ..tensors import Tensor
from . import llama
from .glm import rotary_parts
from .gpt2 import LayerNorm
from .layernorm_lm import LayerNormCausalLM
from .llama import MLP, B, GradientCheckpointingLayer, apply_rotary_pos_emb, rotary_embedding


class Attention(llama.Attention):
    """``StableLmAttention``: Llama's with RoPE on the first ``rotary_ndims`` of each head."""

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        r = cos.shape[-1]  # rotary_ndims: the table's width
        q_rot, q_pass = rotary_parts(q, r)
        k_rot, k_pass = rotary_parts(k, r)
        q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin)
        return A.cat((q_rot, q_pass), -1), A.cat((k_rot, k_pass), -1)


class DecoderLayer(GradientCheckpointingLayer):
    """``StableLmDecoderLayer`` (the module docstring)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        self.parallel = cfg.parallel_block == "one_norm"
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.mlp = MLP(cfg, dtype, name + ".mlp")
        self.input_layernorm = LayerNorm(cfg.d_model, dtype, device, name + ".input_layernorm")
        post = None if self.parallel else LayerNorm(cfg.d_model, dtype, device, name + ".post_attention_layernorm")
        self.post_attention_layernorm = post

    def params(self) -> list[Tensor]:
        post = self.post_attention_layernorm.params() if self.post_attention_layernorm else []
        return self.self_attn.params() + self.mlp.params() + self.input_layernorm.params() + post

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        # ``_`` keeps eager's probabilities until the layer returns
        self_attn_output, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        if self.parallel:
            mlp_output = self.mlp(hidden_states)
            return A.add(A.add(residual, self_attn_output), mlp_output)
        residual = A.add(residual, self_attn_output)
        mlp_output = self.mlp(self.post_attention_layernorm(residual))
        return A.add(residual, mlp_output)


class StableLmForCausalLM(LayerNormCausalLM):
    """``StableLmForCausalLM`` with ``StableLmModel``: the shared skeleton with StableLM's layers and Llama's rotary
    table over the rotated share."""

    layer_class = DecoderLayer

    def rotary(self, hidden_states: Tensor, position_ids: Tensor):
        return rotary_embedding(hidden_states, position_ids, self.inv_freq)


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> StableLmForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return StableLmForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.norm != "layernorm" or cfg.mlp != "swiglu" or cfg.parallel_block == "two_norms" or cfg.moe:
        out.append("a stablelm model with another norm, MLP, block or experts")
    if cfg.qk_norm or cfg.output_bias or cfg.mlp_bias or cfg.sliding_window is not None:
        out.append("a stablelm model with q/k norms, o_proj or MLP biases or a window")
    return out
